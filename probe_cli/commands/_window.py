"""The two windows of steps a command can mean, one flag each (docs/decisions/glossary.md):
look-back ``--last N`` (the last N steps already recorded) and look-ahead ``--for N``
(the next N steps, from the next step boundary). ``--steps`` meant the first on `steps`,
`memory`, `slow` and `trace` and the second on `profile`; it stays as a hidden alias of each
that prints one deprecation line on stderr, so scripts keep working and learn the new name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click
from click.core import ParameterSource

F = TypeVar("F", bound=Callable[..., Any])

_ALIAS = "probe.alias."


def _alias_of(new: str, dest: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if value is None:
            return
        old = param.opts[0]
        click.echo(f"probe: {old} is deprecated here; use {new} {value}", err=True)
        if ctx.get_parameter_source(dest) == ParameterSource.COMMANDLINE:
            raise click.UsageError(f"{old} and {new} name the same window; pass {new} only")
        ctx.meta[_ALIAS + dest] = value

    return callback


def _takes_alias(new: str, old: str) -> Callable[[click.Context, click.Parameter, Any], Any]:
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        alias = ctx.meta.get(_ALIAS + str(param.name))
        if alias is None:
            return value
        if ctx.get_parameter_source(str(param.name)) == ParameterSource.COMMANDLINE:
            raise click.UsageError(f"{old} and {new} name the same window; pass {new} only")
        return alias

    return callback


def _window(new: str, dest: str, default: int | None, minimum: int, help: str) -> Callable[[F], F]:
    kind = click.IntRange(min=minimum)

    def decorate(f: F) -> F:
        # Hidden alias first: click processes the flags given on the command line before the
        # rest, so the alias's value is in ctx.meta when the new flag falls back to its default.
        f = click.option(new, dest, type=kind, default=default, show_default=default is not None,
                         metavar="N", help=help, callback=_takes_alias(new, "--steps"))(f)
        return click.option("--steps", f"_old_{dest}", type=kind, default=None, hidden=True,
                            expose_value=False, callback=_alias_of(new, dest))(f)

    return decorate


def last_option(default: int | None, minimum: int, help: str) -> Callable[[F], F]:
    """``--last N``: the look-back window, into the command's ``last`` argument."""
    return _window("--last", "last", default, minimum, help)


def for_option(default: int, minimum: int, help: str) -> Callable[[F], F]:
    """``--for N``: the look-ahead window, into the command's ``ahead`` argument."""
    return _window("--for", "ahead", default, minimum, help)
