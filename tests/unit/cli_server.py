"""A tiny real HTTP server that answers like a probe agent with canned wire bodies.

Not a mock: the CLI talks real HTTP over a real socket to ``http.server`` on 127.0.0.1 port 0.
Each ``CannedAgent`` is one "rank"; ``canned_job(n)`` starts n of them that list each other in
``/v1/ranks``, so fan-out, timeouts, 401s and partial answers can be tested without torch or
duckdb. The real agent is covered by tests against ``make_agent`` (tests/conftest.py).
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse


def stack(*funcs: str, file: str = "train.py") -> list[dict[str, Any]]:
    """Frames innermost first, line numbers 10, 20, ..."""
    return [
        {"depth": i, "func": f, "file": file, "lineno": 10 * (i + 1), "frame_type": "Python",
         "locals": None}
        for i, f in enumerate(funcs)
    ]


class CannedAgent:
    """One fake rank.

    Args:
        rank: the rank it claims.
        token: when set, requests without ``Bearer <token>`` get the agent's 401 body.
        delay: seconds to sit on every request before answering (a "silent" rank); teardown
            releases it at once.
        frames: the main thread's stack for /v1/backtrace.
        eval_result: what /v1/eval returns as ``result``; code ``1/0`` raises instead.
        extra_backtrace: keys merged into the /v1/backtrace body (``source``, ``gil_holder``).
    """

    def __init__(self, rank: int, *, token: str | None = None, delay: float = 0.0,
                 frames: list[dict[str, Any]] | None = None, eval_result: str = "2",
                 extra_backtrace: dict[str, Any] | None = None) -> None:
        self.rank = rank
        self.token = token
        self.delay = delay
        self.frames = frames if frames is not None else stack("step", "train", "<module>")
        self.eval_result = eval_result
        self.extra_backtrace = extra_backtrace or {}
        self.peers: list[dict[str, Any]] | None = None
        self.world_size: int | None = None  # said in /v1/ranks when set (ranks may be missing)
        self.requests: list[str] = []
        self.release = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True,
                                       name=f"canned-agent-{rank}")

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def address(self) -> str:
        return self.url.removeprefix("http://")

    def entry(self) -> dict[str, Any]:
        return {"rank": self.rank, "url": self.url, "host": "node0", "pid": 1000 + self.rank}

    def start(self) -> CannedAgent:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)

    # -- answers -------------------------------------------------------------------------------

    def answer(self, method: str, path: str, query: dict[str, list[str]],
               body: dict[str, Any] | None, auth: str) -> tuple[int, dict[str, Any]]:
        if self.token is not None and auth != f"Bearer {self.token}":
            why = "missing" if not auth else "wrong"
            return 401, self._error(401, f"{why} token: pass --token or set PROBE_TOKEN to the "
                                         "job's token")
        ok = {"ok": True, "rank": self.rank}
        if path == "/v1/ranks":
            world = {"world_size": self.world_size} if self.world_size else {}
            return 200, {**ok, "ranks": self.peers or [self.entry()], **world}
        if path == "/v1/info":
            return 200, {**ok, "pid": 1000 + self.rank, "host": "node0", "world_size": 1,
                         "local_rank": self.rank, "python": "3.11.7", "torch": "2.13.0",
                         "version": "0.1.0", "uptime_s": 75.0, "url": self.url}
        if path == "/v1/backtrace":
            main = {"thread_id": 100 + self.rank, "thread_name": "MainThread", "is_main": True,
                    "is_agent": False, "frames": self.frames}
            return 200, {**ok, "pid": 1000 + self.rank, "host": "node0",
                         "source": "in-process", "threads": [main], **self.extra_backtrace}
        if path == "/v1/query" and method == "POST":
            sql = (body or {}).get("sql", "")
            if "SELCT" in sql:
                return 400, self._error(400, 'Parser Error: syntax error at or near "SELCT"')
            return 200, {**ok, "columns": ["x", "name"], "types": ["BIGINT", "VARCHAR"],
                         "rows": [[self.rank, f"r{self.rank}"]], "truncated": False,
                         "elapsed_ms": 0.1}
        if path == "/v1/eval" and method == "POST":
            code = (body or {}).get("code", "")
            if code == "1/0":
                tb = ('Traceback (most recent call last):\n  File "<probe eval>", line 1, in '
                      "<module>\nZeroDivisionError: division by zero\n")
                return 400, self._error(400, "ZeroDivisionError: division by zero",
                                        traceback=tb, stdout="", stderr="")
            return 200, {**ok, "result": self.eval_result, "stdout": "", "stderr": "",
                         "elapsed_ms": 0.1}
        return 404, self._error(404, f"no route {method} {path}; see /docs for the API")

    def _error(self, status: int, message: str, **extra: Any) -> dict[str, Any]:
        return {"ok": False, "rank": self.rank, "status": status, "error": message, **extra}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        agent = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def _serve(self, method: str) -> None:
                url = urlparse(self.path)
                agent.requests.append(f"{method} {url.path}")
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                if agent.delay:
                    agent.release.wait(agent.delay)
                body = json.loads(raw) if raw else None
                status, payload = agent.answer(method, url.path, parse_qs(url.query), body,
                                               self.headers.get("authorization", ""))
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up (timeout test)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

        return Handler


@contextmanager
def canned_job(n: int, **per_rank: dict[int, dict[str, Any]] | Any) -> Iterator[list[CannedAgent]]:
    """n canned ranks that all list each other in /v1/ranks.

    ``canned_job(4, overrides={2: {"delay": 5}})`` gives rank 2 its own settings; any other
    keyword applies to every rank.
    """
    overrides: dict[int, dict[str, Any]] = per_rank.pop("overrides", {})
    agents = [CannedAgent(r, **{**per_rank, **overrides.get(r, {})}).start() for r in range(n)]
    peers = [a.entry() for a in agents]
    for a in agents:
        a.peers = peers
    try:
        yield agents
    finally:
        for a in agents:
            a.stop()


def closed_port() -> int:
    """A port nobody listens on: bind to port 0, read the port, close (a real ConnectError)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port
