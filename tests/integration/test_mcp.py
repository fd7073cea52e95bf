"""`probe mcp` driven by the real MCP client of the same SDK, over stdio, against a live agent:
the tools are listed, a query is answered in both forms, the actions are absent unless the
server was started with --allow-actions, and then an eval is audited as sent via mcp."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import pytest

pytest.importorskip("mcp")
pytest.importorskip("duckdb")

from mcp.client.session import ClientSession  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402

from tests.support import python_env  # noqa: E402

READS = {"backtrace", "query", "doctor", "hang", "straggler", "slow", "memory", "throughput",
         "steps", "info", "postmortem", "compare"}
ACTIONS = {"eval", "lr", "checkpoint", "pause", "resume"}


def _session(target: str, *extra: str) -> Any:
    # the SDK passes only a few variables to the server: give it this interpreter's packages
    env = python_env()
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "probe_cli", "-t", target, "mcp", *extra],
                                   env={k: env[k] for k in ("PYTHONPATH", "PATH", "HOME")
                                        if k in env})
    return stdio_client(params)


async def _talk(target: str, extra: tuple[str, ...], calls: list[tuple[str, dict]]) -> Any:
    async with _session(target, *extra) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            tools = {t.name for t in (await s.list_tools()).tools}
            answers = [await s.call_tool(name, args) for name, args in calls]
            schema = await s.read_resource("probe://schema")
            return tools, answers, schema


def test_read_tools_only_by_default_and_a_query_in_both_forms(agent):
    target = agent.url.removeprefix("http://")
    tools, (q, ev), schema = asyncio.run(_talk(target, (), [
        ("query", {"sql": "SELECT 41 + 1 AS answer", "max_rows": 5}),
        ("eval", {"code": "1 + 1", "now": True}),
    ]))
    # THEN every read is a tool and no action is
    assert READS <= tools and not (ACTIONS & tools), tools
    # AND the query answers with the --json body and the text a person reads
    assert not q.is_error
    body = q.structured_content
    assert body["exit_code"] == 0 and body["result"][0]["rows"] == [[42]], body
    assert "answer" in q.content[0].text and "42" in q.content[0].text
    # AND the action is refused: it is not a tool of this server
    assert ev.is_error and "eval" in ev.content[0].text
    # AND the schema is a resource the agent can read before writing SQL
    assert "CREATE TABLE IF NOT EXISTS python.steps" in schema.contents[0].text


def test_actions_with_the_flag_are_audited_as_sent_via_mcp(agent):
    target = agent.url.removeprefix("http://")
    tools, (ev, audit), _ = asyncio.run(_talk(target, ("--allow-actions",), [
        ("eval", {"code": "6 * 7", "now": True}),
        ("query", {"sql": "SELECT client, outcome FROM python.audit WHERE kind = 'eval'"}),
    ]))
    assert ACTIONS <= tools
    assert not ev.is_error and ev.structured_content["exit_code"] == 0, ev.structured_content
    assert "42" in ev.content[0].text
    rows = audit.structured_content["result"][0]["rows"]
    assert any(client.endswith(" via mcp") for client, _ in rows), rows


def test_a_bad_query_is_an_error_in_one_line(agent):
    target = agent.url.removeprefix("http://")
    _, (bad,), _ = asyncio.run(_talk(target, (), [("query", {"sql": "SELCT 1"})]))
    assert bad.is_error and bad.structured_content["exit_code"] == 1
    assert "syntax error" in bad.content[0].text.lower()


def test_without_the_sdk_the_command_says_how_to_install(tmp_path):
    # GIVEN a Python path where `mcp` cannot be imported
    (tmp_path / "mcp").mkdir()
    (tmp_path / "mcp" / "__init__.py").write_text("raise ImportError('no mcp here')\n")
    env = python_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    import subprocess

    r = subprocess.run([sys.executable, "-m", "probe_cli", "-t", "127.0.0.1:1", "mcp"],
                       env=env, capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 1, r.stderr
    assert "pip install 'probe-torch[mcp]'" in r.stderr
