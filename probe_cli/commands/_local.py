"""Helpers for the commands that look at this machine (inject, ps): the run dir and a quick
"does this socket's agent answer" check. Stdlib and httpx only."""

from __future__ import annotations

from typing import Any

import click
import httpx


def run_dir_of(ctx: click.Context) -> str | None:
    """``--run-dir`` of the `probe` group, if given."""
    root = ctx.find_root()
    return root.params.get("run_dir") if root.params else None


def ask_socket(path: str, route: str = "/v1/health", timeout: float = 1.0) -> Any:
    """The JSON body a unix-socket agent answers on ``route`` (any status), or None."""
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=path), base_url="http://localhost",
                          timeout=timeout, trust_env=False) as c:
            return c.get(route).json()
    except (httpx.HTTPError, ValueError, OSError):
        return None


def agent_answers(path: str) -> bool:
    body = ask_socket(path)
    return isinstance(body, dict) and "rank" in body
