"""A quick "does the agent on this unix socket answer" check, for `probe ps` and `probe inject`.

A raw one-shot HTTP/1.0 GET: cheaper than an httpx client per socket when `probe ps` checks
every socket in the run dir, and enough for ``GET /v1/health``, which answers anyone and carries
no token. Everything else goes through ``ProbeClient``. Stdlib only.
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any

from probe_protocol import routes
from probe_protocol.peers import unix_peer_uid

from .untrusted_text import escape_body

HEALTH = routes.HEALTH.path


def ask_socket(path: str, route: str = HEALTH, timeout: float = 1.0) -> Any:
    """The JSON body a unix-socket agent answers on ``route`` (any status), its strings'
    control characters escaped; None when nothing answers, or when the socket's server is not
    us or root (SO_PEERCRED, asked after connecting: a file check before it can be raced).

    Any status is read: an error body is still an answer.
    """
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(path)
            if unix_peer_uid(s) not in (os.getuid(), 0):
                return None
            s.sendall(f"GET {route} HTTP/1.0\r\nHost: localhost\r\n\r\n".encode())
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
    except OSError:
        return None
    _, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    try:
        return escape_body(json.loads(body))
    except ValueError:
        return None


def agent_answers(path: str) -> bool:
    body = ask_socket(path)
    return isinstance(body, dict) and "rank" in body
