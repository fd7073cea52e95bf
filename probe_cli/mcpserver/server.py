"""`probe mcp`: probe's commands as Model Context Protocol tools, over stdio.

A coding agent (Claude Code, Cursor, Codex...) starts ``probe -t TARGET mcp`` and calls tools
instead of guessing flags and scraping text. Each tool runs the matching `probe` command
(runner.py) and answers with both forms: ``structuredContent`` holds the command's ``--json``
answer (with its exit code and what the code means), and the text content what a person would
read. Answers are capped (``--max-bytes``; `query` also caps rows), so a large table cannot
flood the agent's context.

Safe by default: only commands that read are tools. `eval`, `lr`, `checkpoint`, `pause`,
`resume` and `guard` change the job; they exist only when the server was started with
``--allow-actions``, and every call is then audited by the agents as sent via the MCP server
(``python.audit``: client and requested_by end in ``via mcp``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..errors import EXIT_FAILURE, EXIT_FINDING, EXIT_OK, EXIT_PARTIAL, EXIT_USAGE
from ..transport.postmortem import schema_text
from .runner import DEFAULT_MAX_BYTES, GroupOptions, parse_json, run_command

EXIT_MEANING = {
    EXIT_OK: "every targeted rank answered",
    EXIT_FAILURE: "nothing usable: no rank answered (or every rank failed)",
    EXIT_USAGE: "usage error: a bad argument",
    EXIT_PARTIAL: "partial: some ranks failed or stayed silent (listed in stderr)",
    EXIT_FINDING: "a diagnosis found a problem: the verdict names it",
}
INSTRUCTIONS = """probe diagnoses a running (or dead) distributed PyTorch training job: every rank
carries an agent with in-memory tables. Start with `doctor` (every diagnosis, culprit first),
`hang` for a stuck job, `straggler` for a slow rank, `slow` for slow modules, `memory`,
`throughput`. `query` runs read-only SQL over the python.* tables (read the probe://schema
resource first: it documents every table and column). `compare` puts two runs side by side.
Exit code 4 means a problem was found; 3 that some ranks did not answer."""


def build_server(opts: GroupOptions, *, commands: Collection[str], allow_actions: bool,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> Any:
    """The MCPServer with one tool per available command (``commands``: those the CLI has)."""
    from mcp.server.mcpserver import MCPServer  # lazy: only `probe mcp` needs the SDK

    server = MCPServer("probe", instructions=INSTRUCTIONS, log_level="WARNING")

    def call(args: list[str], *, action: bool = False) -> Any:
        return answer(opts, args, action=action, max_bytes=max_bytes)

    for tool in _read_tools(call):
        if tool.__name__ in commands:
            server.add_tool(tool, name=tool.__name__, description=tool.__doc__)
    if allow_actions:
        for tool in _action_tools(call):
            if tool.__name__ in commands:
                server.add_tool(tool, name=tool.__name__, description=tool.__doc__)

    @server.resource("probe://schema", name="schema", mime_type="text/plain",
                     description="sql/schema.sql: every python.* table and column, documented")
    def schema() -> str:
        return schema_text()

    return server


def answer(opts: GroupOptions, args: list[str], *, action: bool, max_bytes: int) -> Any:
    """Run ``probe ARGS`` and build the tool's result. A read runs twice side by side, once
    for ``--json`` and once for the text; an action runs once (``--json``), never twice."""
    from mcp_types import CallToolResult, TextContent

    if action:
        run = run_command(opts, args, json_output=True, max_bytes=max_bytes)
        text_run = run
    else:
        with ThreadPoolExecutor(2) as pool:
            js = pool.submit(run_command, opts, args, json_output=True, max_bytes=max_bytes)
            tx = pool.submit(run_command, opts, args, json_output=False, max_bytes=max_bytes)
            run, text_run = js.result(), tx.result()
    data = parse_json(run)
    structured = {"command": "probe " + " ".join(args), "exit_code": run.exit_code,
                  "meaning": EXIT_MEANING.get(run.exit_code, "unexpected exit code"),
                  "result": data, "stderr": run.stderr.splitlines(),
                  "truncated": run.truncated}
    if run.truncated:
        structured["note"] = (f"the answer was cut at {max_bytes} bytes: ask for less (a LIMIT, "
                              "fewer columns, --rank, a smaller last)")
    text = text_run.stdout.rstrip()
    if text_run.truncated:
        text += f"\n[cut at {max_bytes} bytes]"
    if run.stderr.strip():
        text = (text + "\n" + run.stderr.rstrip()).strip()
    if action and data is not None:
        text = json.dumps(data, indent=1, default=str)[:max_bytes]
    return CallToolResult(content=[TextContent(type="text", text=text or "(no output)")],
                          structured_content=structured,
                          is_error=run.exit_code in (EXIT_FAILURE, EXIT_USAGE))


def _with(args: list[str], **opts: Any) -> list[str]:
    """``args`` plus ``--name value`` for each option given (flags: True adds ``--name``)."""
    out = list(args)
    for name, value in opts.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value not in (None, False):
            out += [flag, str(value)]
    return out


def _read_tools(call: Callable[..., Any]) -> list[Callable[..., Any]]:
    def backtrace(rank: str | None = None, locals: bool = False, all: bool = False) -> Any:
        """Where every rank is: Python stacks, identical ones grouped, outliers first; answers
        from outside the process when a rank's GIL is held. rank: like "0,3" or "0-7";
        locals: show local variables (secrets redacted); all: every thread."""
        return call(_with(["backtrace"], rank=rank, locals=locals, all=all))

    def query(sql: str, rank: str | None = None, max_rows: int = 200) -> Any:
        """Read-only SQL over the python.* tables of every rank (see the probe://schema
        resource), one table with a rank column. max_rows caps the rows of each rank."""
        return call(_with(["query", sql], rank=rank, max_rows=max(1, min(max_rows, 10_000))))

    def doctor(last: int | None = None) -> Any:
        """Every diagnosis at once, ranked, culprit first, each with its evidence and the next
        command to run. Exit 4: a problem was found."""
        return call(_with(["doctor"], last=last))

    def hang() -> Any:
        """Is the job stuck, which rank never reached which collective, and where it is."""
        return call(["hang"])

    def straggler(last: int | None = None) -> Any:
        """Which rank the others wait for in collectives, and by how much."""
        return call(_with(["straggler"], last=last))

    def slow(last: int | None = None, limit: int | None = None) -> Any:
        """The slowest modules of every rank by self time per step, forward and backward."""
        return call(_with(["slow"], last=last, limit=limit))

    def memory(last: int | None = None) -> Any:
        """Where each rank's memory goes (parameters, gradients, optimizer state, activations,
        the rest), whether it grows, and what would free it."""
        return call(_with(["memory"], last=last))

    def throughput(last: int | None = None) -> Any:
        """Tokens/s, samples/s, MFU, where a step goes, and the biggest lever."""
        return call(_with(["throughput"], last=last))

    def steps(last: int | None = None) -> Any:
        """Step time trend per rank and the outlier steps."""
        return call(_with(["steps"], last=last))

    def numerics(last: int | None = None) -> Any:
        """The loss and gradient health: spikes, NaN/Inf with the module that made them,
        divergence, stalls, clipping."""
        return call(_with(["numerics"], last=last))

    def health() -> Any:
        """healthy / hung / dead / straggling, per rank and for the job."""
        return call(["health"])

    def info() -> Any:
        """Each rank's agent: pid, host, versions, tracing, watchdog, what probe changed."""
        return call(["info"])

    def postmortem(root: str | None = None) -> Any:
        """The post-mortem copies of dead (or kept) jobs: their ranks and how each ended. A
        job's directory is then a target for compare (or for the server's -t)."""
        return call(["postmortem", *([root] if root else [])])

    def compare(a: str, b: str, last: int | None = None, threshold: float | None = None) -> Any:
        """Run B against run A (each a HOST:PORT, local PID or post-mortem directory): step
        time with an interval, the modules behind the change, and what else changed. Exit 4:
        B differs by at least threshold percent (default 5) at 95% confidence."""
        return call(_with(["compare", a, b], last=last, threshold=threshold))

    return [backtrace, query, doctor, hang, straggler, slow, memory, throughput, steps, numerics,
            health, info, postmortem, compare]


def _action_tools(call: Callable[..., Any]) -> list[Callable[..., Any]]:
    def eval(code: str, now: bool = False) -> Any:  # noqa: A001 - the command's own name
        """Run Python inside every rank (remote code execution in the job). By default at the
        next step boundary on every rank at once; now=True runs it beside the training thread
        (no collectives then)."""
        return call(["eval", code] + ([] if now else ["--next-step"]), action=True)

    def lr(scale: float | None = None, set: float | None = None) -> Any:  # noqa: A002
        """Change the learning rate on every rank at the next step boundary (refused when the
        job's scheduler would undo it)."""
        return call(_with(["lr"], scale=scale, set=set), action=True)

    def checkpoint(path: str) -> Any:
        """Save the model, optimizer and scheduler at the next step boundary to PATH."""
        return call(["checkpoint", path], action=True)

    def pause() -> Any:
        """Pause every rank at the next step boundary (resume continues)."""
        return call(["pause"], action=True)

    def resume() -> Any:
        """Resume a paused job."""
        return call(["resume"], action=True)

    def guard(args: list[str]) -> Any:
        """Arm or disarm the step guard: args are `probe guard`'s own arguments."""
        return call(["guard", *args], action=True)

    return [eval, lr, checkpoint, pause, resume, guard]
