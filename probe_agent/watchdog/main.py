"""Watchdog process entry: ``python -I -S -c "...; main()"`` with its config on stdin.

The config (JSON, from ``serving/watchdog_link.py``): ``pid, rank, hostname, run_dir,
inner_path, tcp_fd, uds_fd, token, pyspy, reader, dump_signal, deadline_ms, grace_s, snapshot_s,
port``. It prints ``ready`` on stdout once it serves, then closes stdout. SIGTERM ends it at
once (the agent stopped on purpose); SIGUSR1 makes a dead rank's watchdog give its TCP port back
(a restarted rank wants it); otherwise it lives as long as its rank plus the grace period, and
the grace ends as soon as the rank's launcher (its parent: the job) is gone too.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import socket
import sys
import time
from typing import TYPE_CHECKING, Any

from probe_protocol.runfiles import RunFiles

from .httpwire import MAX_HEAD
from .postmortem import record_death
from .proxy import Proxy
from .rank import RankWatch
from .reader import StackReader

if TYPE_CHECKING:
    import ssl


#: Seconds between checks, after the rank died, of whether its launcher is still there.
JOB_POLL_S = 0.5


class Watchdog:
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.files = RunFiles(cfg["run_dir"], cfg["pid"])
        self.reader = StackReader(cfg["pid"], cfg.get("pyspy"), cfg.get("reader", "auto"),
                                  self.files.dump, cfg.get("dump_signal"))
        self.rank = RankWatch(cfg["pid"], self.files, self.reader, self._rank_died)
        self.proxy = Proxy(cfg, self.rank, self.reader)
        self.servers: dict[str, asyncio.AbstractServer] = {}
        self.stop = asyncio.Event()
        self.until: float | None = None

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for kind in ("tcp", "unix"):
            fd = self.cfg.get(f"{kind}_fd" if kind == "tcp" else "uds_fd")
            if fd is None:
                continue
            sock = socket.socket(fileno=fd)
            self.servers[kind] = await asyncio.start_server(
                functools.partial(self.proxy.handle, kind=kind), sock=sock, limit=MAX_HEAD,
                ssl=self._tls() if kind == "tcp" else None)
        loop.add_signal_handler(signal.SIGTERM, self.stop.set)
        loop.add_signal_handler(signal.SIGUSR1, self._release_port)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.rank.start(loop)
        self.proxy.health.start(loop)
        self._record()
        snapshots = asyncio.ensure_future(self.rank.snapshot_loop(
            self.proxy.fetch_in_process, self.cfg["snapshot_s"], self.proxy.deadline_s))
        refusals = asyncio.ensure_future(self.proxy.refusals.run())
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # let the agent's pipe close
        await self.stop.wait()
        snapshots.cancel()
        refusals.cancel()
        for srv in self.servers.values():
            srv.close()
        self._cleanup()

    def _tls(self) -> ssl.SSLContext | None:
        """PROBE_TLS_CERT/KEY (the agent validated them before starting us)."""
        if not self.cfg.get("tls_cert"):
            return None
        import ssl  # only with TLS: without it the watchdog is started with ssl blocked

        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cfg["tls_cert"], self.cfg["tls_key"])
        return ctx

    def _rank_died(self) -> None:
        e = self.rank.exit or {}
        clean = e.get("code") == 0 and not e.get("exception")
        grace = 0.0 if clean else float(self.cfg["grace_s"])
        self.until = time.time() + grace
        loop = asyncio.get_running_loop()
        loop.call_later(grace, self.stop.set)
        if grace > 0:
            loop.call_soon(self._end_with_job, loop)
        try:
            os.unlink(self.files.inner)
        except OSError:
            pass
        record_death(self.files, self.rank, keep=bool(self.cfg.get("postmortem_keep")))
        self._record()

    def _end_with_job(self, loop: asyncio.AbstractEventLoop) -> None:
        """The grace serves a dead rank's forensics while its job lives (the launcher, the
        other ranks, an operator running `probe`); once the launcher is gone too, stop within
        ``JOB_POLL_S`` instead of holding the ports and a process for the rest of the grace."""
        if self.stop.is_set():
            return
        if self.rank.job_gone():
            self.stop.set()
            return
        loop.call_later(JOB_POLL_S, self._end_with_job, loop)

    def _release_port(self) -> None:
        srv = self.servers.pop("tcp", None)
        if srv is not None and not self.rank.alive:
            srv.close()
            self.cfg["port"] = None
            self._record()
        elif srv is not None:
            self.servers["tcp"] = srv  # a live rank keeps its port

    def _record(self) -> None:
        """``<pid>.watchdog.json``: for `probe ps`, and for a restarted rank that wants the port."""
        rec = {"watchdog_pid": os.getpid(), "pid": self.cfg["pid"], "rank": self.cfg["rank"],
               "state": "alive" if self.rank.alive else "dead", "exit": self.rank.exit,
               "last_step": self.rank.last_step, "host": self.cfg.get("host"),
               "port": self.cfg.get("port") if "tcp" in self.servers else None,
               "until": self.until}
        tmp = self.files.watchdog + ".tmp"
        try:
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                json.dump(rec, f)
            os.replace(tmp, self.files.watchdog)
        except OSError:
            pass

    def _cleanup(self) -> None:
        paths = [self.files.watchdog]
        if not self.rank.alive:  # the agent cannot clean up after a dead rank: we do
            paths += [self.files.sock, self.files.json, self.files.inner,
                      *self.files.forensic_files()]
        try:
            if os.path.getsize(self.files.log) == 0:
                paths.append(self.files.log)
        except OSError:
            pass
        for path in paths:
            try:
                os.unlink(path)
            except OSError:
                pass


def main() -> None:
    cfg = json.loads(sys.stdin.buffer.read() or b"{}")
    sys.stdin.close()
    asyncio.run(Watchdog(cfg).run())


if __name__ == "__main__":
    main()
