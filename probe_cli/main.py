"""The `probe` command group and ``main()``: the only place that writes stdout and stderr.

Flow: ``main(argv)`` rewrites ``probe ENDPOINT CMD`` into ``probe -t ENDPOINT CMD``, runs the
click group with ``standalone_mode=False``, and turns what comes back into an exit code:
a command's ``Outcome`` is printed; a ``ProbeCLIError`` becomes ``probe: message`` plus a hint;
a click usage error is shown by click (exit 2). Any other exception is a bug and keeps its
traceback. Exit codes are documented in ``probe_cli/errors.py``.

Commands live in ``probe_cli/commands/<name>.py`` and are registered automatically.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any

import click
from click.core import ParameterSource

from .commands import register_commands
from .errors import EXIT_FAILURE, ProbeCLIError, UsageProblemError
from .outcome import Outcome
from .transport.client import ssl_context
from .transport.session import Progress, Session
from .transport.targets import (
    DEFAULT_TARGET,
    Endpoint,
    default_endpoint,
    default_run_dir,
    parse_endpoints,
    parse_rank_list,
    read_hostfile,
    rewrite_endpoint_argv,
)

#: Commands that reach no job through the session's targets (they find local processes, or
#: read post-mortem copies, or build locally): two live agents in the run dir must not make
#: them ask for -t.
_LOCAL_COMMANDS = frozenset({"ps", "launch", "inject", "postmortem", "build-native"})

CONTEXT_SETTINGS = {
    # PROBE_TARGET, PROBE_TOKEN, PROBE_TIMEOUT... for every option, new commands included.
    "auto_envvar_prefix": "PROBE",
    "help_option_names": ["-h", "--help"],
    "max_content_width": 100,
}


def _version() -> str:
    """The installed distribution's version; from the source tree's ``_version.py`` (read as
    text: the CLI never imports the agent) when running from a checkout."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("probe-torch")
    except PackageNotFoundError:
        import re
        from pathlib import Path

        path = Path(__file__).resolve().parent.parent / "probe_agent" / "_version.py"
        try:
            found = re.search(r'__version__ = "([^"]+)"', path.read_text())
        except OSError:
            found = None
        return found.group(1) if found else "unknown"


def _print_version(ctx: click.Context, _: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(f"probe {_version()}")
        ctx.exit(0)


@click.group(context_settings=CONTEXT_SETTINGS)
@click.option("--version", is_flag=True, expose_value=False, is_eager=True,
              callback=_print_version, help="Print probe's version and exit.")
@click.option("-t", "--target", "targets", multiple=True, envvar="PROBE_TARGET",
              metavar="HOST:PORT[,…]",
              help="Agent(s) to ask: HOST:PORT, http(s)://URL, a local PID (its unix socket) or "
                   "unix:/path. One target: every rank it knows of is reached. Several "
                   "(repeat -t or use commas): exactly those agents. Default: the only agent "
                   "socket in the run dir, else 127.0.0.1:9700.")
@click.option("--hostfile", type=click.Path(dir_okay=False), default=None,
              help="File with one HOST:PORT per line (# comments allowed); adds to -t.")
@click.option("--rank", "ranks", metavar="N[,N…]", default=None,
              help="Only these ranks, like 0,3 or 0-7. Default: every rank.")
@click.option("--json", "output", flag_value="json",
              help="Print one JSON array of the per-rank wire bodies, in rank order.")
@click.option("--csv", "output", flag_value="csv", help="Print CSV with a rank column.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=5.0,
              show_default=True, metavar="SECONDS",
              help="Per-rank wait; a rank slower than this is reported as silent (exit 3).")
@click.option("--token", envvar="PROBE_TOKEN", default=None, show_envvar=True,
              help="Bearer token of the job (agents started with PROBE_TOKEN need it).")
@click.option("--token-file", envvar="PROBE_TOKEN_FILE", type=click.Path(dir_okay=False),
              default=None, show_envvar=True, help="Read the token from this file.")
@click.option("--cacert", envvar="PROBE_CACERT", type=click.Path(dir_okay=False), default=None,
              show_envvar=True, metavar="CA.pem",
              help="Verify agents' TLS certificates (PROBE_TLS_CERT) against this CA bundle "
                   "instead of the system's; HOST:PORT targets then use https.")
@click.option("--run-dir", envvar="PROBE_RUN_DIR", default=None, show_envvar=True,
              help="Where local agents' unix sockets are. Default: /tmp/probe-<uid>.")
@click.option("--no-color", is_flag=True, help="No colour (sets NO_COLOR for the process).")
@click.option("--raw", is_flag=True,
              help="Print the agents' strings as they are. By default their control "
                   "characters (terminal escapes) are shown as \\xNN: text from a job is data.")
@click.pass_context
def cli(
    ctx: click.Context,
    targets: tuple[str, ...],
    hostfile: str | None,
    ranks: str | None,
    output: str | None,
    timeout: float,
    token: str | None,
    token_file: str | None,
    cacert: str | None,
    run_dir: str | None,
    no_color: bool,
    raw: bool,
) -> None:
    """Query, eval and backtrace every rank of a running PyTorch job.

    \b
    probe [-t HOST:PORT] COMMAND ...     or     probe ENDPOINT COMMAND ...
    where ENDPOINT is HOST:PORT, a URL or a local PID.

    Exit codes: 0 every rank answered, 1 nothing usable, 2 usage error, 3 partial (the
    failed or silent ranks are listed on stderr), 4 a diagnosis found a problem.
    """
    if no_color:
        os.environ["NO_COLOR"] = "1"
    run_dir = run_dir or default_run_dir()
    values = list(targets) + (read_hostfile(hostfile) if hostfile else [])
    if cacert:
        ssl_context(cacert)  # an unreadable CA file fails here, once, not on every rank
    scheme = "https" if cacert else "http"
    endpoints = parse_endpoints(values, run_dir, scheme)
    note = None
    if not endpoints and ctx.invoked_subcommand in _LOCAL_COMMANDS:
        endpoints = [Endpoint(f"{scheme}://{DEFAULT_TARGET}")]  # never asked: no job to pick
    elif not endpoints:
        endpoint, note = default_endpoint(run_dir, scheme)
        endpoints = [endpoint]
    output = output or "text"
    session = Session(
        endpoints=endpoints,
        rank_filter=parse_rank_list(ranks) if ranks else None,
        timeout=timeout,
        token=_pick_token(ctx, token, token_file),
        cacert=cacert,
        output=output,
        colour=output == "text" and decide_colour(os.environ, sys.stdout),
        target_note=note,
        progress=_progress_for(sys.stderr),
        raw=raw,
        run_dir=run_dir,
    )
    ctx.obj = session
    ctx.call_on_close(session.close)
    ctx.call_on_close(lambda: _print_notes(session))


@cli.result_callback()
def _stream_stdout(rv: Any, **_: Any) -> Any:
    """A command with a ``stream`` (``probe query --json`` at scale) is still asking ranks
    while it is printed: print it here, while the session (its connections) is open; ``emit``
    prints the rest after the session closed, as for every other command."""
    if isinstance(rv, Outcome) and rv.stream is not None:
        for line in rv.stream:
            click.echo(line, color=True)
        rv.stream = None
    return rv


register_commands(cli)


def decide_colour(environ: Mapping[str, str], stream: IO[str]) -> bool:
    """Colour when stdout is a TTY and NO_COLOR is unset, or when FORCE_COLOR is set (rich's
    precedence; --no-color has already set NO_COLOR, and wins over FORCE_COLOR)."""
    if environ.get("NO_COLOR"):
        return False
    if environ.get("FORCE_COLOR"):
        return True
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _pick_token(ctx: click.Context, token: str | None, token_file: str | None) -> str | None:
    """--token beats --token-file; either on the command line beats the environment."""
    if token_file is None:
        return token
    file_on_cli = ctx.get_parameter_source("token_file") == ParameterSource.COMMANDLINE
    token_on_cli = ctx.get_parameter_source("token") == ParameterSource.COMMANDLINE
    if token is not None and (token_on_cli or not file_on_cli):
        return token
    try:
        mode = os.stat(token_file).st_mode
        if mode & 0o077:  # as ssh does with key files: a token others can read is no secret
            raise UsageProblemError(
                f"token file {token_file} is readable by other users (mode {mode & 0o777:o})",
                help_text=f"run: chmod 600 {token_file}")
        with open(token_file, encoding="utf-8") as f:
            text = f.read().strip()
    except OSError as e:
        raise UsageProblemError(f"cannot read token file {token_file}: {e.strerror}") from e
    return text or None


def _progress_for(stream: IO[str]) -> Progress:
    """An "answered 12/64" line on a TTY stderr while several ranks are awaited; else nothing."""
    isatty = getattr(stream, "isatty", None)
    if not (isatty and isatty()):
        return lambda done, total: None
    state = {"shown": False, "last": 0.0}

    def progress(done: int, total: int) -> None:
        if total <= 1:
            return
        if done >= total:
            if state["shown"]:
                stream.write("\r\x1b[K")
                stream.flush()
                state["shown"] = False
            return
        now = time.monotonic()
        if now - state["last"] < 0.05:  # a 512-rank burst need not redraw 512 times
            return
        state["last"] = now
        stream.write(f"\ranswered {done}/{total}")
        stream.flush()
        state["shown"] = True

    return progress


def _value_options(group: click.Group) -> list[str]:
    """The group's options that take a value (so `-t X` is not read as `probe X CMD`)."""
    names: list[str] = []
    for p in group.params:
        if isinstance(p, click.Option) and not p.is_flag and not p.count:
            names += [*p.opts, *p.secondary_opts]
    return names


def hoist_global_options(args: list[str], group: click.Group) -> list[str]:
    """`probe query "SQL" --rank 0` -> `probe --rank 0 query "SQL"`: the group's options
    (``--rank``, ``--json``, ``--timeout``, ``-t``...) work after the subcommand too, where
    users type them. Left in place: an option the subcommand defines itself (its own wins),
    anything after ``--``, and commands that take raw arguments (``launch -- CMD``)."""
    value_opts = set(_value_options(group))
    flags = {o for p in group.params if isinstance(p, click.Option) and p.is_flag
             for o in (*p.opts, *p.secondary_opts)}
    i = 0
    while i < len(args):  # find the subcommand past the group's own options
        if args[i] == "--":
            return args
        if args[i] in value_opts:
            i += 2
        elif args[i].startswith("-"):
            i += 1
        else:
            break
    cmd = group.commands.get(args[i]) if i < len(args) else None
    if cmd is None or cmd.context_settings.get("ignore_unknown_options"):
        return args
    own = {o for p in cmd.params if isinstance(p, click.Option)
           for o in (*p.opts, *p.secondary_opts)}
    head, rest, moved = args[: i + 1], args[i + 1:], []
    j = 0
    while j < len(rest):
        name = rest[j].split("=", 1)[0]
        if rest[j] == "--":
            break
        if name in own or name not in value_opts | flags:
            j += 1
            continue
        n = 2 if name in value_opts and "=" not in rest[j] and j + 1 < len(rest) else 1
        moved += rest[j: j + n]
        del rest[j: j + n]
    return [*args[:i], *moved, *head[i:], *rest]


def emit(outcome: Outcome) -> None:
    """Print a command's Outcome: results on stdout, everything else on stderr."""
    for line in outcome.stream or ():
        click.echo(line, color=True)
    for line in outcome.stdout:
        click.echo(line, color=True)
    for line in outcome.stderr:
        click.echo(line, err=True, color=True)


def _print_notes(session: Session) -> None:
    for note in dict.fromkeys(session.notes):  # once each, in order
        click.echo(f"probe: note: {note}", err=True)


def report(error: ProbeCLIError) -> None:
    click.echo(f"probe: {error.message}", err=True)
    if error.help_text and error.help_text not in error.message:
        click.echo(f"hint: {error.help_text}", err=True)


#: Set when Ctrl-C ended the command: the console script then exits at once instead of
#: joining the fan-out's threads, which wait for their requests (an eval: until it ends).
INTERRUPTED = False


def main(argv: Sequence[str] | None = None) -> int:
    """Run `probe` and return its exit code (0, 1, 2 or 3; see probe_cli/errors.py)."""
    args = list(sys.argv[1:] if argv is None else argv)
    args = rewrite_endpoint_argv(args, cli.commands, _value_options(cli))
    args = hoist_global_options(args, cli)
    try:
        rv = cli.main(args, prog_name="probe", standalone_mode=False)
    except ProbeCLIError as e:
        report(e)
        return e.exit_code
    except click.exceptions.Abort:  # Ctrl-C (click turns KeyboardInterrupt into Abort)
        click.echo("probe: interrupted; what was already sent to the ranks (an eval, an "
                   "action) keeps running there", err=True)
        global INTERRUPTED
        INTERRUPTED = True
        return EXIT_FAILURE
    except click.ClickException as e:
        e.show()
        return e.exit_code
    if isinstance(rv, Outcome):
        emit(rv)
        return rv.exit_code
    return rv if isinstance(rv, int) else 0
