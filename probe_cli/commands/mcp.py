"""`probe mcp`: serve probe's commands as MCP tools over stdio, for coding agents.

Register it with a coding agent as a stdio server whose command is ``probe -t TARGET mcp``
(docs/mcp.md). Reads only, unless started with ``--allow-actions``.
"""

from __future__ import annotations

import click

from ..errors import MissingDependencyError
from ..mcpserver.runner import DEFAULT_MAX_BYTES, GroupOptions
from ..outcome import Outcome
from ..transport.session import Session
from . import pass_session


@click.command("mcp")
@click.option("--allow-actions", is_flag=True,
              help="Also offer the tools that change the job (eval, lr, checkpoint, pause, "
                   "resume, guard); every call is audited as sent via mcp. Off: reads only.")
@click.option("--max-bytes", type=click.IntRange(min=1024), default=DEFAULT_MAX_BYTES,
              show_default=True, help="Largest answer a tool returns; the rest is cut, "
                                      "and the answer says so.")
@click.pass_context
@pass_session
def command(session: Session, ctx: click.Context, allow_actions: bool, max_bytes: int
            ) -> Outcome:
    """Serve probe's commands as Model Context Protocol tools on stdin/stdout (for Claude
    Code, Cursor, Codex...): backtrace, query (read-only SQL; the schema is the probe://schema
    resource), doctor, hang, straggler, slow, memory, throughput, steps, numerics, health, info,
    postmortem and compare. Each answers with the command's --json result, its exit code and
    the text a person would read, capped at --max-bytes. The target, token and TLS options
    given to probe apply to every tool, with the CLI's access rules."""
    try:
        import mcp.server.mcpserver  # noqa: F401 - fail here, with the install line
    except ImportError:
        raise MissingDependencyError(
            "probe mcp needs the MCP SDK", help_text="pip install 'probe-torch[mcp]'") from None
    from ..mcpserver.server import build_server

    parent = ctx.parent
    group = parent.params if parent is not None else {}
    opts = GroupOptions(targets=tuple(group.get("targets") or ()),
                        hostfile=group.get("hostfile"), ranks=group.get("ranks"),
                        timeout=session.timeout, cacert=session.cacert,
                        run_dir=group.get("run_dir"), token=session.token)
    cli = parent.command if parent is not None else None
    commands = set(cli.commands) if isinstance(cli, click.Group) else set()
    server = build_server(opts, commands=commands, allow_actions=allow_actions,
                          max_bytes=max_bytes)
    server.run("stdio")
    return Outcome()
