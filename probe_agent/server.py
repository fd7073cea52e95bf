"""AgentServer: the agent's sockets and the uvicorn thread that serves them.

Sockets are bound in the caller's thread, so ``start()`` fails at once, with a message, when a
port is taken; uvicorn only receives ready sockets (``Server.run(sockets=...)``). We never call
``uvicorn.run`` or ``Config.bind_socket`` (it ``sys.exit(1)``s on failure).

uvicorn runs as a guest: ``log_config=None`` (the host's logging is untouched), access log off,
lifespan off, asyncio loop, and no signal handlers (uvicorn installs them only from the main
thread; ours is ``probe-agent.http``).

Every accepted connection goes through ``_GuardedProtocol.connection_made``: TCP connections get
TCP_NODELAY (without it, keep-alive requests sit on a 44–48 ms Nagle/delayed-ACK floor), and unix
socket peers are checked with SO_PEERCRED: only our own uid or root may talk to the agent.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import socket
import stat
import struct
import threading
import time
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

try:  # httptools (C) parses HTTP at a fraction of h11's (pure Python) CPU, in the training process
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _BaseProtocol
except ImportError:  # pragma: no cover - httptools is in the agent extra; h11 still works
    _BaseProtocol = H11Protocol

from .errors import BindError

log = logging.getLogger(__name__)


def bind_tcp(host: str, port: int, rank: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as e:
        sock.close()
        hint = (
            "set PROBE_PORT=0 to pick a free port, or another base port"
            if e.errno == errno.EADDRINUSE
            else "check PROBE_HOST is an address of this machine"
        )
        raise BindError(
            f"probe agent on rank {rank} could not bind {host}:{port} ({e.strerror}); {hint}"
        ) from None
    sock.set_inheritable(False)
    return sock


def bind_unix(
    run_dir: str, pid: int, rank: int, name: str | None = None
) -> tuple[socket.socket, str]:
    """Bind ``run_dir/<pid>.sock`` (or ``run_dir/<name>``) with the run dir 0700 and the socket
    0600. ``name`` is the watchdog's private hop to the agent (issue 5)."""
    path = os.path.join(run_dir, name or f"{pid}.sock")
    try:
        os.makedirs(run_dir, mode=0o700, exist_ok=True)
        st = os.stat(run_dir)
        if st.st_uid != os.getuid():
            raise BindError(
                f"probe agent on rank {rank}: run dir {run_dir} belongs to uid {st.st_uid}, not "
                f"us; set PROBE_RUN_DIR to a directory you own"
            )
        if stat.S_IMODE(st.st_mode) != 0o700:
            os.chmod(run_dir, 0o700)
        if os.path.exists(path):
            os.unlink(path)  # a stale socket from a recycled pid
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(path)
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        sock.listen(64)
    except OSError as e:
        raise BindError(
            f"probe agent on rank {rank} could not create {path} ({e.strerror}); "
            "set PROBE_RUN_DIR to a writable directory or PROBE_UNIX_SOCKET=0"
        ) from None
    sock.set_inheritable(False)
    return sock, path


def peer_uid(sock: socket.socket) -> int | None:
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


def _make_protocol(rank: int) -> type[Any]:
    my_uid = os.getuid()

    class _GuardedProtocol(_BaseProtocol):  # type: ignore[misc, valid-type]
        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            sock = transport.get_extra_info("socket")
            if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
                try:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                except OSError:
                    pass
            elif sock is not None and sock.family == socket.AF_UNIX:
                uid = peer_uid(sock)
                if uid not in (my_uid, 0):
                    body = json.dumps(
                        {
                            "ok": False,
                            "rank": rank,
                            "status": 403,
                            "error": f"uid {uid} may not use this agent's socket; "
                            f"run probe as uid {my_uid} or root",
                        }
                    ).encode()
                    transport.write(
                        b"HTTP/1.1 403 Forbidden\r\ncontent-type: application/json\r\n"
                        b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
                    )
                    transport.close()
                    return
            super().connection_made(transport)

    return _GuardedProtocol


class _GuestServer(uvicorn.Server):
    """uvicorn's Server with a quieter housekeeping loop.

    uvicorn wakes its event loop 10 times a second to refresh the Date header and check
    ``should_exit``; each wake-up takes the GIL from the training thread. Here the loop wakes
    once a second (the Date header has one-second resolution anyway), and ``stop()`` wakes it
    at once through ``call_soon_threadsafe``.
    """

    _wake: asyncio.Event | None = None
    _loop: asyncio.AbstractEventLoop | None = None

    async def main_loop(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=1.0)
            except asyncio.TimeoutError:
                pass
            counter = (counter + 10) % 864000  # on_tick refreshes the Date header every 10th
            should_exit = await self.on_tick(counter)

    def wake(self) -> None:
        loop, ev = self._loop, self._wake
        if loop is not None and ev is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(ev.set)
            except RuntimeError:  # the loop closed in between
                pass


class AgentServer:
    """Serves ``app`` on already-bound sockets from a ``probe-agent.http`` daemon thread.

    Args:
        sockets: served as plain HTTP.
        tls_sockets: served as HTTPS with ``tls``'s PROBE_TLS_CERT/PROBE_TLS_KEY (the TCP port
            when no watchdog owns it). uvicorn applies one SSL setting to all the sockets of a
            server, so these get a second server on the same event loop.
    """

    def __init__(self, app: Any, sockets: list[socket.socket], rank: int, *,
                 tls_sockets: list[socket.socket] | None = None, tls: Any = None) -> None:
        self.sockets = [*sockets, *(tls_sockets or [])]

        def config(**ssl: Any) -> uvicorn.Config:
            return uvicorn.Config(
                app,
                log_config=None,
                log_level="error",  # "Invalid HTTP request" warnings are noise in a training log
                access_log=False,
                lifespan="off",
                loop="asyncio",
                http=_make_protocol(rank),
                limit_concurrency=256,
                timeout_keep_alive=30,
                timeout_graceful_shutdown=1,
                **ssl,
            )

        self._servers: list[tuple[_GuestServer, list[socket.socket]]] = []
        if sockets:
            self._servers.append((_GuestServer(config()), sockets))
        if tls_sockets:
            srv = _GuestServer(config(ssl_certfile=tls.tls_cert, ssl_keyfile=tls.tls_key))
            self._servers.append((srv, tls_sockets))
        self._thread: threading.Thread | None = None

    @property
    def started(self) -> bool:
        return all(srv.started for srv, _ in self._servers)

    def _run(self) -> None:
        async def serve_all() -> None:
            await asyncio.gather(*(srv.serve(sockets=socks) for srv, socks in self._servers))

        asyncio.run(serve_all())

    def start(self, timeout: float = 10.0) -> None:
        self._thread = threading.Thread(target=self._run, name="probe-agent.http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise BindError("probe agent: the HTTP server did not start; see the log above")
            time.sleep(0.005)

    def stop(self, timeout: float = 5.0) -> None:
        for srv, _ in self._servers:
            srv.should_exit = True
            srv.wake()
        if self._thread is not None:
            self._thread.join(timeout)
        for s in self.sockets:
            try:
                s.close()
            except OSError:
                pass
