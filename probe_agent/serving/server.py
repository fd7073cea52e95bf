"""AgentServer: the agent's sockets and the uvicorn thread that serves them.

Sockets are bound in the caller's thread, so ``start()`` fails at once, with a message, when a
port is taken; uvicorn only receives ready sockets (``Server.run(sockets=...)``). We never call
``uvicorn.run`` or ``Config.bind_socket`` (it ``sys.exit(1)``s on failure).

uvicorn runs as a guest: ``log_config=None`` (the host's logging is untouched), access log off,
lifespan off, asyncio loop, and no signal handlers (uvicorn installs them only from the main
thread; ours is ``probe-agent.http``).

Every accepted connection goes through ``_GuardedProtocol.connection_made``: TCP connections get
TCP_NODELAY (without it, keep-alive requests sit on a 44–48 ms Nagle/delayed-ACK floor), unix
socket peers are checked with SO_PEERCRED (only our own uid or root may talk to the agent), and
TCP peers' uids are read for the access rule that app.py applies per request (access.py).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import stat
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, cast

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

if TYPE_CHECKING:  # typed as the usual base; h11's has the same surface where we override it
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _BaseProtocol
else:
    try:  # httptools (C) parses HTTP at a fraction of h11's (pure Python) CPU, in the rank
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _BaseProtocol
    except ImportError:  # pragma: no cover - httptools is in the agent extra; h11 still works
        _BaseProtocol = H11Protocol

from probe_protocol.envelope import encode, error_body
from probe_protocol.peers import Peer, tcp_peer, unix_peer_uid
from probe_protocol.runfiles import RunFiles

from ..access import (
    LINGER_S,
    REQUEST_TIMEOUT_S,
    SCOPE_KEYS,
    SCOPE_PEER,
    Gate,
    overload_message,
)
from ..errors import BindError

log = logging.getLogger(__name__)


def bind_tcp(host: str, port: int, rank: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        # A deep backlog: a burst of connections queues in the kernel instead of being reset
        # (a 1000-request burst got 244 resets with 128).
        sock.listen(1024)
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
    0600. ``name`` is the watchdog's private hop to the agent."""
    path = os.path.join(run_dir, name) if name else RunFiles(run_dir, pid).sock
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
    except BindError:
        raise  # BindError is an OSError too: keep its own message (it read "(None)")
    except OSError as e:
        raise BindError(
            f"probe agent on rank {rank} could not create {path} ({e.strerror}); "
            "set PROBE_RUN_DIR to a writable directory or PROBE_UNIX_SOCKET=0"
        ) from None
    sock.set_inheritable(False)
    return sock, path


def close_sockets(sockets: Iterable[socket.socket]) -> None:
    """Close every socket, whatever state each is in: a stopping server, a stopping watchdog
    link and a forked child (which must not keep its parent's listening sockets open) all
    need every one closed even when one fails."""
    for s in sockets:
        try:
            s.close()
        except OSError:
            pass


def _refuse(transport: Any, rank: int, status: int, message: str) -> None:
    """Answer with the JSON error body and close, after reading what the client already sent
    for up to LINGER_S: closing with unread input makes the kernel send a reset, which can
    destroy the answer before the client reads it (a 1000-connection burst got 744 resets)."""
    body = encode(error_body(rank, status, message))
    reason = {403: b"Forbidden", 408: b"Request Timeout", 503: b"Service Unavailable"}[status]
    transport.write(
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"content-length: %d\r\n\r\n%s" % (status, reason, len(body), body)
    )
    try:
        if transport.can_write_eof():
            transport.write_eof()
    except (OSError, RuntimeError):
        pass
    asyncio.get_running_loop().call_later(LINGER_S, transport.close)


def _make_protocol(rank: int, gate: Gate) -> type[Any]:
    """uvicorn's protocol with the access rule's connection-level half (probe_agent/access.py):
    the peer's uid read once per connection, per-class connection limits answered with the
    JSON error body, and a deadline for each request's head and body (uvicorn has none)."""
    timed = hasattr(_BaseProtocol, "on_message_complete")  # httptools; h11 has no callbacks

    class _GuardedProtocol(_BaseProtocol):
        _probe_refused = False  # answered by _refuse: what still arrives is dropped
        _probe_keys: list[str] | None = None
        _probe_peer: Peer | None = None
        _probe_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            sock = transport.get_extra_info("socket")
            if sock is not None and sock.family == socket.AF_UNIX:
                peer = Peer("unix", unix_peer_uid(sock), "unix")
                if not gate.policy.is_owner(peer):
                    refusal = gate.policy.check(peer, "", "", {})
                    self._probe_refused = True
                    _refuse(transport, rank, 403, refusal.message if refusal else "refused")
                    return
            elif sock is not None:
                try:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                except OSError:
                    pass
                peer = tcp_peer(sock)
            else:
                peer = Peer("remote", None, "unknown")
            keys = gate.limits.admit(peer)
            if keys is None:
                self._probe_refused = True
                _refuse(transport, rank, 503, overload_message(peer))
                return
            self._probe_keys, self._probe_peer = keys, peer
            super().connection_made(transport)
            self._probe_arm()

        def data_received(self, data: bytes) -> None:
            if not self._probe_refused:
                super().data_received(data)

        def eof_received(self) -> None:
            if self._probe_refused:
                return  # the client read our answer and closed: None (false) closes ours too
            super().eof_received()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._probe_refused and self._probe_keys is None:
                return  # refused before uvicorn's protocol was set up: nothing of it to end
            gate.limits.release(self._probe_keys)
            self._probe_keys = None
            self._probe_disarm()
            super().connection_lost(exc)

        def _probe_arm(self) -> None:
            if timed and self._probe_timer is None:
                self._probe_timer = self.loop.call_later(REQUEST_TIMEOUT_S, self._probe_expired)

        def _probe_disarm(self) -> None:
            if self._probe_timer is not None:
                self._probe_timer.cancel()
                self._probe_timer = None

        def _probe_expired(self) -> None:
            self._probe_timer = None
            if not self.transport.is_closing():
                self._probe_refused = True
                _refuse(self.transport, rank, 408,
                        f"request not received within {REQUEST_TIMEOUT_S:g} s; connection closed")

        def on_message_begin(self) -> None:
            super().on_message_begin()
            # AdmissionMiddleware (app.py) reads who is asking, and on which share of the limits.
            # ASGI lets a server add its own scope keys; uvicorn's HTTPScope TypedDict cannot.
            scope = cast("dict[str, Any]", self.scope)
            scope[SCOPE_PEER] = self._probe_peer
            scope[SCOPE_KEYS] = self._probe_keys
            self._probe_arm()

        def on_message_complete(self) -> None:
            self._probe_disarm()
            super().on_message_complete()

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

    def __init__(self, app: Any, sockets: list[socket.socket], rank: int, gate: Gate, *,
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
                http=_make_protocol(rank, gate),
                # Our own per-class limits (access.py) answer first, with the JSON body;
                # uvicorn's would answer a plain-text 503 to everyone alike.
                limit_concurrency=4096,
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
        self.close_sockets()

    def close_sockets(self) -> None:
        """Close the listening sockets (``stop``; a forked child, which must not answer for its
        parent, calls only this: the server's threads do not exist there)."""
        close_sockets(self.sockets)
