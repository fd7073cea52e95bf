"""Helpers for the commands that look at this machine (inject, ps): the run dir they were given.
The run-dir layout and the rule for files of processes that are gone are
probe_protocol/runfiles.py; the "does this socket's agent answer" check is
transport/local_socket.py. Stdlib only."""

from __future__ import annotations

import click


def run_dir_of(ctx: click.Context) -> str | None:
    """``--run-dir`` of the `probe` group, if given."""
    root = ctx.find_root()
    return root.params.get("run_dir") if root.params else None
