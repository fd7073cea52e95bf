"""One vocabulary for windows of steps: `--last N` looks back on every command that reads
recorded steps, `--for N` looks ahead (`profile`); the old `--steps` of each still works, hidden,
with one deprecation line on stderr."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from probe_cli.commands._window import for_option, last_option
from probe_cli.main import cli


@click.command()
@last_option(20, 1, "look back")
def back(last: int) -> None:
    click.echo(f"last={last}")


@click.command()
@for_option(5, 1, "look ahead")
def ahead(ahead: int) -> None:
    click.echo(f"for={ahead}")


@pytest.mark.parametrize(("command", "argv", "printed", "warned"), [
    (back, [], "last=20", False),
    (back, ["--last", "7"], "last=7", False),
    (back, ["--steps", "7"], "last=7", True),
    (ahead, ["--for", "3"], "for=3", False),
    (ahead, ["--steps", "3"], "for=3", True),
], ids=["default", "last", "old-steps-is-last", "for", "old-steps-is-for"])
def test_new_flags_and_their_hidden_aliases(command, argv, printed, warned):
    # WHEN the command runs with the new flag, the old one, or neither
    result = CliRunner().invoke(command, argv)
    # THEN the value lands in the one argument, and only the old flag says it is deprecated
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == printed
    assert ("--steps is deprecated" in result.stderr) is warned
    assert len(result.stderr.splitlines()) == int(warned)


@pytest.mark.parametrize("argv", [["--last", "3", "--steps", "4"], ["--steps", "4", "--last", "3"]])
def test_old_and_new_flag_together_is_a_usage_error(argv):
    result = CliRunner().invoke(back, argv)
    assert result.exit_code == 2 and "pass --last only" in result.stderr


def test_the_windows_are_named_one_way_on_every_command():
    """The surface people type: look-back is --last, look-ahead --for; --steps is hidden."""
    def visible(name: str) -> set[str]:
        return {o for p in cli.commands[name].params if not getattr(p, "hidden", False)
                for o in p.opts}

    for name in ("steps", "memory", "slow", "trace", "doctor", "straggler"):
        assert "--last" in visible(name), name
        assert "--steps" not in visible(name), name
        assert "--steps" not in cli.commands[name].get_help(click.Context(cli.commands[name]))
    assert "--for" in visible("profile") and "--steps" not in visible("profile")
    assert "--last" not in visible("profile")
