"""Agent: wires the store, the collectors, the evaluator and the HTTP server of one rank.

This is the top of the agent's layers (docs/decisions/agent.md): it builds every part
and hands each what it uses; no part imports this module. Only process.py does: it keeps the
process's one agent, and the entry points go through it.

Lifecycle: ``start()`` binds every socket in the caller's thread (so a taken port fails at once),
then starts the writer and HTTP threads. ``stop()`` is idempotent and joins them. A forked child
(a DataLoader worker) gets ``process._after_fork_in_child``: the agent is marked stopped there
and the inherited listening sockets are closed, so the worker never answers for its parent.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import replace
from typing import Any

from probe_protocol.bodies import InfoBody, RankEntry
from probe_protocol.runfiles import RunFiles
from probe_protocol.tokens import sign_entry
from probe_protocol.version import FORMAT

from . import patches, rundir
from ._version import __version__
from .access import Gate, Policy, RefusalLog
from .actions import ActionQueue
from .audit import AuditLog
from .clock import StepClock
from .collectors.registry import Collectors, build_collectors
from .collectors.stacks import BacktraceTables
from .config import AgentConfig
from .errors import EvalError
from .evaluator import Evaluator
from .frameworks.playbook import resolve
from .profiling.sessions import Profiling
from .ranks import Identity, RankRegistry, publish_rank
from .serving.idle_pool import IdlePool
from .settings import LOCAL_RANK_VARS, first_set
from .step_cost import measure

log = logging.getLogger(__name__)


class Agent:
    def __init__(self, config: AgentConfig, identity: Identity) -> None:
        # Lazy: duckdb and pyarrow load with the store, when an agent is built, never at
        # `import probe_agent.process` (probe_agent.log and the role hooks import it).
        from .store.store import Store

        self.config = config
        self.identity = identity
        self.rank = identity.rank
        # who may reach this agent (access.py), and the audit of whom it turned away.
        self.gate = Gate(Policy.for_agent(config.token, [
            identity.host, config.advertise_host or "", *config.allowed_hosts]))
        #: Why TCP is not served, when it is not (a non-loopback host without a token).
        self.tcp_off: str | None = None
        self.tcp_port: int | None = None
        self.started_at = time.time()
        self.store = Store(config)
        self.audit_log = AuditLog(self.store, self.rank)
        self.refusals = RefusalLog(self._audit_refusal_row)
        # the one step counter of this agent (the tracer uses it too).
        self.stepclock = StepClock()
        self.evaluator = Evaluator(
            config.eval_timeout_s, config.eval_output_bytes, rank=self.rank,
            playbook=self._playbook,
            step_cost=lambda since, until: measure(self.store.query, since, until))
        # Separate pools so a slow query can never starve eval or backtrace, and vice versa.
        # Their threads end after IDLE_S without work (idle_pool.py): a quiet agent keeps none.
        self.query_pool = IdlePool(4, "probe-agent.query")
        # SQL only: DuckDB work that yields the CPU to training (nice 10, cpu_priority.py); the
        # canned diagnostics the verdicts wait on have their own threads, so that an operator's
        # heavy join cannot hold up `probe doctor`.
        self.sql_pool = IdlePool(4, "probe-agent.sql", background="nice")
        self.canned_pool = IdlePool(4, "probe-agent.canned", background="nice")
        self.eval_pool = IdlePool(2, "probe-agent.evalwait")
        self.collectors = Collectors()  # built and started by start()
        self.url: str | None = None
        self.unix_path: str | None = None
        self._server: Any = None
        self.postmortem: Any = None  # set by start() unless PROBE_POSTMORTEM=off
        self._info_path: str | None = None
        self._owned_inodes: dict[str, int] = {}
        self.peers: dict[int, RankEntry] = {}
        self.serve_budget: Any = None  # set by create_app: requests' CPU budget (budget.py)
        self.running = False
        #: what ``stop`` restored and what it kept, and why (patches.restore_all)
        self.stop_report: dict[str, Any] | None = None
        #: the out-of-process companion that owns the public sockets
        #: (serving/watchdog_link.py).
        self.watchdog: Any = None
        # Profile windows and flame sessions; the run dir is settled by start() first.
        self.profiling = Profiling(config.run_dir, self.rank, self.stepclock, self.store,
                                   tracer=lambda: self.collectors.tracer, audit=self.audit)
        # The queue of step-boundary actions that rides on the step clock.
        self.actions = ActionQueue(self.stepclock, self.evaluator, rank=self.rank,
                                   timeout_s=config.action_timeout_s, audit=self.audit,
                                   running=lambda: self.running, profiling=self.profiling)

    def _playbook(self, names: list[str]) -> dict[str, Any]:
        """The playbook names of an eval (``optimizer``, ``model``...) from the framework
        layer, with the optimizers this agent's clock saw stepping."""
        return resolve(names, None, self.stepclock.optimizers())

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        # Lazy: fastapi and uvicorn load when an agent starts, never at import.
        from .serving.ports import bind_tcp_reclaiming
        from .serving.server import bind_unix

        if self.config.unix_socket:
            self._settle_run_dir()
        sockets = []
        try:
            if self.config.tcp and not self.config.loopback_only and self.config.token is None:
                # stacks, locals and table data are not for the whole network.
                self.tcp_off = (f"PROBE_HOST={self.config.host} is not loopback and PROBE_TOKEN "
                                "is not set")
                sys.stderr.write(
                    f"probe agent on rank {self.rank}: not listening on TCP: {self.tcp_off}; "
                    "set PROBE_TOKEN_FILE (a 0600 file) to serve other hosts. The unix socket "
                    "still answers on this machine (`probe ps`).\n")
            elif self.config.tcp:
                tcp = bind_tcp_reclaiming(self.config, self.rank,
                                           self.identity.local_world_size)
                sockets.append(tcp)
                host, port = tcp.getsockname()[:2]
                self.tcp_port = port
                if self.config.advertise_host:
                    host = self.config.advertise_host
                elif host in ("0.0.0.0", "::"):
                    host = self.identity.host  # a wildcard is not an address clients can use
                shown = f"[{host}]" if ":" in host else host
                self.url = f"{'https' if self.config.tls else 'http'}://{shown}:{port}"
            if self.config.unix_socket:
                uds, self.unix_path = bind_unix(self.config.run_dir, self.identity.pid, self.rank)
                self._owned_inodes[self.unix_path] = os.stat(self.unix_path).st_ino
                sockets.append(uds)
        except BaseException:
            for s in sockets:
                s.close()
            raise
        # python.backtrace(_all) answer from the first request, before the collectors start.
        BacktraceTables(self.stepclock, self.rank).start(self.store)
        self.store.start()
        serve, tls = sockets, []
        if self.config.watchdog:
            from .serving.watchdog_link import WatchdogLink

            # The watchdog will own the public sockets (and their TLS); the agent serves a
            # private one.
            self.watchdog = WatchdogLink.create(
                self.config, self.identity, self.stepclock, self.gate.policy.host_names,
                sockets, serve_fallback=self._serve)
            if self.watchdog is not None:
                serve = [self.watchdog.inner_socket]
        if self.watchdog is None and self.config.tls and self.config.tcp:
            serve, tls = sockets[1:], sockets[:1]  # the TCP socket is bound first
        self._server = self._serve(serve, tls)
        self.postmortem = self._new_postmortem()
        if self.postmortem is not None:
            # Before the watchdog starts: its SIGTERM dump then chains to the end hooks.
            self.postmortem.start()
        if self.watchdog is not None:
            self.watchdog.start()
        self.running = True
        self.stepclock.start(self.store)
        self.actions.start()
        self._start_collectors()
        self._write_info_file()

    def _new_postmortem(self) -> Any:
        """The post-mortem copy of this rank's tables (probe_agent/postmortem/), unless off."""
        if self.config.postmortem == "off":
            return None
        from .postmortem import Postmortem, launch

        ident = self.identity
        job, offer = launch.job_of(os.environ, ident.pid)
        return Postmortem(
            self.store, root=self.config.postmortem_dir or os.path.join(
                self.config.run_dir, "postmortem"), job=job, offer=offer, rank=self.rank,
            run_dir=self.config.run_dir if self.config.unix_socket else None, pid=ident.pid,
            every_s=self.config.postmortem_every_s, budget_mb=self.config.postmortem_mb,
            keep=self.config.postmortem == "always",
            meta=lambda: {"rank": self.rank, "world_size": self.identity.world_size,
                          "pid": ident.pid, "host": ident.host, "started_at": self.started_at,
                          "step": self.stepclock.current_step if self.stepclock.seen_step
                          else None, "argv": list(sys.argv[:8]), "version": __version__})

    def _serve(self, plain: list[Any], tls: list[Any]) -> Any:
        """Start an HTTP server of this agent on ``plain`` and ``tls`` sockets (the agent's
        own, or the public ones when the watchdog cannot serve them)."""
        from .serving.app import create_app
        from .serving.server import AgentServer

        server = AgentServer(create_app(self), plain, self.rank, self.gate, tls_sockets=tls,
                             tls=self.config)
        server.start()
        return server

    def _settle_run_dir(self) -> None:
        """A run dir that cannot be used falls back to a private one, with one warning, and
        dead jobs' files are cleared from it (rundir.py)."""
        path, warning = rundir.choose(self.config.run_dir)
        if warning is not None:
            log.warning("probe agent on rank %d: %s", self.rank, warning)
            self.config = self.config.with_(run_dir=path)
            self.profiling.out_dir = os.path.join(path, "profiles")
        removed = rundir.sweep(path, keep=self.identity.pid)
        if removed:
            log.info("probe agent: removed %d files of dead processes from %s", len(removed),
                     path)

    def _start_collectors(self) -> None:
        self.collectors = build_collectors(self.stepclock, self.rank, self.config,
                                           ranks=self._rank_registry)
        if self.collectors.trainloop is not None:
            self.actions.scaler = self.collectors.trainloop.scaler
        self.actions.numerics = lambda: self.collectors.get("numerics")
        if self.postmortem is not None and self.collectors.collectives is not None and \
                os.path.isdir(self.postmortem.path):
            from probe_protocol.postmortem import STRIP

            # The explicit collectives' black box beside the copy: it outlives an abort.
            recorder = self.collectors.collectives
            recorder.attach_strip(os.path.join(self.postmortem.path, STRIP))
            # ... and the last collectives at the rank's end, in end.json (a SIGTERM while
            # blocked in DDP's all-reduce left a table copy a refresh old).
            self.postmortem.end_extra = lambda: {"collectives": recorder.rows()[-16:]}
        self.collectors.start(self.store)

    def _rank_registry(self) -> RankRegistry:
        def on_peers(peers: dict[int, RankEntry]) -> None:
            self.peers = peers

        return RankRegistry(self._entry, on_group=self.adopt_group, on_peers=on_peers,
                            token=self.config.token)

    def _entry(self) -> RankEntry:
        """This rank's entry in the job's rank registry and in /v1/ranks."""
        return RankEntry(self.rank, self.url, self.identity.host, self.identity.pid)

    def stop(self) -> None:
        if not self.running:
            return
        self.running = False
        exiting = not threading.main_thread().is_alive()
        if self.postmortem is not None:
            # First: the last copy needs the collectors' buffers and the store.
            self.postmortem.close(exiting, watchdog_stays=self.watchdog is not None and exiting)
        self.profiling.stop()  # no profile window or flame session outlives the agent
        self.collectors.stop()
        self.actions.stop()  # releases a paused training thread
        self.stepclock.stop()
        # At interpreter exit the watchdog stays to report the death, and keeps our files.
        handover = self.watchdog.stop() if self.watchdog is not None else False
        if self.postmortem is not None and not exiting:
            self.postmortem.release()
        if self._server is not None:
            self._server.stop()
        self.store.stop()
        for pool in (self.query_pool, self.sql_pool, self.canned_pool, self.eval_pool):
            # Not wait=True: a wedged eval must not hang interpreter exit. Workers finish on
            # their own (queries are interrupted by their timer, evals by theirs).
            pool.shutdown(wait=False, cancel_futures=True)
            for th in list(getattr(pool, "_threads", ())):
                th.join(2.0)
        for path in () if handover else (self.unix_path, self._info_path):
            if path:
                try:
                    # Only our own file: a newer agent in this pid (re-injection, stop/start)
                    # may have bound the same path since.
                    if os.stat(path).st_ino == self._owned_inodes.get(path):
                        os.unlink(path)
                except OSError:
                    pass
        self._restore_patches()

    def _restore_patches(self) -> None:
        """Put back what the parts left replaced (each restores its own when it stops: this
        catches the rest), and say what stays in the process and why (patches.py)."""
        self.stop_report = patches.restore_all()
        kept = "; ".join(f"{k['target']} ({k['why']})" for k in self.stop_report["kept"])
        log.info("probe agent on rank %d stopped: restored %d more replaced attributes%s",
                 self.rank, len(self.stop_report["restored"]),
                 f"; kept: {kept}" if kept else "")

    def adopt_group(self, rank: int, world_size: int) -> None:
        """Take the identity ``init_process_group`` gave this process.

        Lightning's rank 0 starts with no RANK or WORLD_SIZE, and a rank started from its
        environment may be renumbered by the group. Rows written from now on carry the new
        rank; the port stays (base + LOCAL_RANK, bound at start). Called on the training
        thread right after ``init_process_group`` returns (roles.py), and by the rank registry
        when it first sees the group (an agent injected after init)."""
        ident = self.identity
        try:
            local = int(os.environ.get(first_set(os.environ, LOCAL_RANK_VARS), ""))
        except ValueError:
            local = ident.local_rank
        if (rank, world_size, local) == (ident.rank, ident.world_size, ident.local_rank):
            return
        if rank != ident.rank:
            log.warning("probe agent: rank %d until now, init_process_group gave rank %d; "
                        "using %d", ident.rank, rank, rank)
        self.identity = replace(ident, rank=rank, world_size=world_size, local_rank=local)
        self.rank = self.actions.rank = self.profiling.rank = self.audit_log.rank = rank
        if self.watchdog is not None:
            self.watchdog.rank = rank
        # The collectors stamp every row with the rank they were built with.
        for _, collector in self.collectors.running():
            for holder in (collector, getattr(collector, "resolver", None)):
                if holder is not None and hasattr(holder, "rank"):
                    holder.rank = rank
        publish_rank(self.identity)
        self._write_info_file()

    def _write_info_file(self) -> None:
        """``run_dir/<pid>.json`` lets `probe ps` and `probe PID` find this agent locally."""
        if not self.config.unix_socket:
            return
        path = RunFiles(self.config.run_dir, self.identity.pid).json
        try:
            self._owned_inodes[path] = rundir.write_record(path, self.info().to_wire())
            self._info_path = path
        except OSError as e:
            log.warning("probe agent: could not write %s: %s", path, e)

    # -- what routes call -------------------------------------------------------------------
    def info(self) -> InfoBody:
        torch = sys.modules.get("torch")
        return InfoBody(
            rank=self.rank,
            local_rank=self.identity.local_rank,
            world_size=self.identity.world_size,
            pid=self.identity.pid,
            host=self.identity.host,
            python=sys.version.split()[0],
            torch=getattr(torch, "__version__", None),
            version=__version__,
            started_at=self.started_at,
            uptime_s=round(time.time() - self.started_at, 3),
            url=self.url,
            unix_socket=self.unix_path,
            argv=tuple(sys.argv[:8]),
            trace=getattr(self.collectors.tracer, "mode", self.config.trace),
            hot_path=self._hot_path(),
            watchdog=self.watchdog.describe() if self.watchdog is not None else None,
            serve_cpu=self.config.serve_cpu,
            access=self.access_info(),
            queued_s=round(getattr(self.serve_budget, "waited_s", 0.0), 3),
            format=FORMAT,
            patches=tuple(p.describe() for p in patches.active()),
            settings=tuple(s.describe() for s in patches.settings()),
        )

    def _hot_path(self) -> str | None:
        tracer = self.collectors.tracer
        return tracer.hot_path_text() if tracer is not None else None

    def access_info(self) -> dict[str, Any]:
        """Who may reach this agent (`probe info`); never the token itself."""
        mode = self.gate.policy.mode + (" + tls" if self.config.tls else "")
        return {"mode": mode, "owner_uid": self.gate.policy.owner_uid,
                "tcp": "off: " + self.tcp_off if self.tcp_off else ("on" if self.url else "off"),
                **self.refusals.describe()}

    def audit_refusal(self, client: str, method: str, path: str, refusal: Any) -> None:
        self.refusals.record(client, f"{method} {path}", refusal.reason,
                             f"HTTP {refusal.status}: {refusal.message}", time.time())

    def _audit_refusal_row(self, client: str, what: str, reason: str, message: str) -> None:
        self.audit(client, what, "refused", message, 0.0, kind="access")

    def known_ranks(self) -> list[RankEntry]:
        me = self._entry()
        if self.config.token:
            me = RankEntry.from_wire(sign_entry(self.config.token, me.to_wire())) or me
        merged = {**self.peers, self.rank: me}
        return [merged[r] for r in sorted(merged)]

    def audit(self, client: str, code: str, outcome: str, error: str | None, ms: float,
              **action: Any) -> None:
        """One row of python.audit (audit.py); ``action`` (kind, action_id, at_step,
        requested_by) is set by step-boundary actions, profiles and refusals; a plain eval is
        kind 'eval' and goes to python.evals too."""
        self.audit_log.record(client, code, outcome, error, ms, **action)

    def run_eval(self, code: str, client: str, eval_id: str | None = None) -> Any:
        try:
            out = self.evaluator.run(code, client, eval_id=eval_id)
        except EvalError as e:
            self.audit(client, code, "error", e.message, 0.0)
            raise
        outcome = "ok" if out.ok else ("timeout" if out.timed_out else "error")
        if out.replayed:  # the same request again: answered from the eval that ran
            outcome = "replayed"
        self.audit(client, code, outcome, out.error, out.elapsed_ms)
        if not out.ok:
            status = 408 if out.timed_out else 400
            job = out.job
            err = EvalError(
                out.error or "eval failed",
                traceback=out.traceback,
                stdout=out.stdout,
                stderr=out.stderr,
                id=job.id if job else None,
                still_running=bool(job and job.still_running),
                cost=job.cost if job else {},
            )
            err.status = status
            raise err
        return out
