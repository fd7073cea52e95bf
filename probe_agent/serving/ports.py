"""The TCP port of a rank: its own (base + LOCAL_RANK), asked back from the watchdog of a dead
predecessor, or the next free one when another job holds it.

The watchdog of a rank that died keeps the public sockets to report the death
(watchdog_link.py); a restarted rank on the same node wants its port back, so it asks that
watchdog (SIGUSR1) to let go, once, before looking elsewhere.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import time

from probe_protocol.runfiles import WATCHDOG_SUFFIX

from ..config import AgentConfig
from ..errors import BindError
from .server import bind_tcp

log = logging.getLogger(__name__)

#: How many other ports a rank tries when its own is taken (another job on the node).
PORT_TRIES = 64


def reclaim_port(run_dir: str, port: int, timeout: float = 2.0) -> bool:
    """Ask the watchdogs of *dead* ranks that still hold ``port`` to let go (a restarted rank
    wants its port back); True when one was asked and has let go."""
    asked = []
    try:
        names = [n for n in os.listdir(run_dir) if n.endswith(WATCHDOG_SUFFIX)]
    except OSError:
        return False
    for name in names:
        try:
            with open(os.path.join(run_dir, name)) as f:
                rec = json.load(f)
            if rec.get("state") == "dead" and rec.get("port") == port:
                os.kill(int(rec["watchdog_pid"]), signal.SIGUSR1)
                asked.append(os.path.join(run_dir, name))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    deadline = time.monotonic() + timeout
    while asked and time.monotonic() < deadline:
        time.sleep(0.02)
        still = []
        for path in asked:
            try:
                with open(path) as f:
                    if json.load(f).get("port") == port:
                        still.append(path)
            except (OSError, ValueError):
                pass
        if not still:
            return True
        asked = still
    return False


def bind_tcp_reclaiming(config: AgentConfig, rank: int, local_world: int) -> socket.socket:
    """bind_tcp; a port still held by the watchdog of this rank's dead predecessor (a restart
    on the same node) is asked back once. A port another job holds (two jobs on one node with
    the default base) is not an error: the rank takes the next free one in steps of the node's
    rank count, so that rank r of the second job does not take the port rank r+1 of that job
    wants, and registers it for discovery as usual."""
    try:
        return bind_tcp(config.host, config.port, rank)
    except BindError as first:
        if config.port == 0:
            raise
        if reclaim_port(config.run_dir, config.port):
            return bind_tcp(config.host, config.port, rank)
        step = max(1, local_world)
        for k in range(1, PORT_TRIES + 1):
            port = config.port + k * step
            if port > 65535:
                break
            try:
                sock = bind_tcp(config.host, port, rank)
            except BindError:
                continue
            log.warning("probe agent on rank %d: port %d is taken (another job?); listening "
                        "on %d instead (`probe ps` and /v1/ranks show it)", rank, config.port,
                        port)
            return sock
        raise first
