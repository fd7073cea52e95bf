"""Helpers for the commands that look at this machine (inject, ps): the run dir and a quick
"does this socket's agent answer" check. Stdlib only."""

from __future__ import annotations

import json
import socket
from typing import Any

import click


def run_dir_of(ctx: click.Context) -> str | None:
    """``--run-dir`` of the `probe` group, if given."""
    root = ctx.find_root()
    return root.params.get("run_dir") if root.params else None


def ask_socket(path: str, route: str = "/v1/health", timeout: float = 1.0) -> Any:
    """The JSON body a unix-socket agent answers on ``route`` (any status), or None.

    A raw one-shot HTTP/1.0 GET: cheaper than an httpx client per socket when `probe ps`
    checks every socket in the run dir.
    """
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(path)
            s.sendall(f"GET {route} HTTP/1.0\r\nHost: localhost\r\n\r\n".encode())
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
    except OSError:
        return None
    _, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    try:
        return json.loads(body)
    except ValueError:
        return None


def agent_answers(path: str) -> bool:
    body = ask_socket(path)
    return isinstance(body, dict) and "rank" in body
