"""probe's commands, one module each.

To add a command, create ``probe_cli/commands/<name>.py`` that defines a click command (any
module-level name, e.g. ``command``); ``register_commands`` finds it (no list to edit, so
parallel work does not collide). A command takes the ``Session`` with ``@pass_session`` and
returns an ``Outcome`` (usually from ``outcome.finish``); main.py prints it. Modules whose
name starts with ``_`` are helpers, not commands. See ``info.py`` for the smallest complete example.
"""

from __future__ import annotations

import importlib
import pkgutil

import click

from ..transport.session import Session

#: ``@pass_session`` gives a command the invocation's Session (targets, ranks, output mode).
pass_session = click.make_pass_decorator(Session)


def register_commands(group: click.Group) -> None:
    """Add every click command defined (not merely imported) at module level in
    ``probe_cli.commands.<name>`` to ``group``, modules in name order."""
    for mod in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if mod.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{mod.name}")
        found = [
            obj
            for obj in vars(module).values()
            if isinstance(obj, click.Command)
            and getattr(obj.callback, "__module__", None) == module.__name__
        ]
        if not found:
            raise TypeError(f"{module.__name__} defines no click command")
        for command in found:
            group.add_command(command)
