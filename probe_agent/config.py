"""AgentConfig: every PROBE_* setting the agent reads, validated in one place.

Built from an environment mapping (``AgentConfig.from_env(os.environ)``) so tests pass a dict.
Every validation message names the variable to fix. Which variable sets which field, and how
its text is parsed, is settings.py (the settings table); here is what each means and which
values are valid.
"""

from __future__ import annotations

import ipaddress
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from probe_protocol import runfiles

from .errors import ConfigError
from .settings import DEFAULT_BASE_PORT, environ_values, raise_config

#: DuckDB's room for queries above the tables' share when PROBE_DB_MEMORY_MB is unset: every
#: canned query, and an ad-hoc group-by, sort and window over all of torch_trace, ran at full
#: retention within it; slow_modules needed more than 128 (docs/decisions/store.md).
DB_QUERY_ROOM_MB = 256
_TRACE_RE = re.compile(r"^(on|off|every:([1-9][0-9]*))$")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, kw_only=True, slots=True)
class AgentConfig:
    host: str = "127.0.0.1"
    """PROBE_HOST. Loopback by default: /v1/eval is remote code execution. A non-loopback host
    without PROBE_TOKEN does not listen on TCP at all (the unix socket still answers)."""

    advertise_host: str | None = None
    """PROBE_ADVERTISE_HOST: the host put in this agent's URL for discovery (`probe -t` fans out
    to it). Default: PROBE_HOST, or this machine's hostname when PROBE_HOST is 0.0.0.0 / ::.
    Set it when clients reach the rank through another name (NAT, published container ports)."""

    port: int = DEFAULT_BASE_PORT
    """PROBE_PORT plus LOCAL_RANK. 0 picks a free port (read it from /v1/info or the run dir)."""

    token: str | None = None
    """PROBE_TOKEN (or the file named by PROBE_TOKEN_FILE, which must be 0600). Who may reach
    the agent (access.py): its owner (same uid, or root) on this machine, or whoever sends
    ``Authorization: Bearer <token>``. Without it a non-loopback PROBE_HOST serves no TCP."""

    allowed_hosts: tuple[str, ...] = ()
    """PROBE_ALLOWED_HOSTS: comma-separated names a request's Host header may carry besides IP
    addresses, localhost, this machine's hostname and PROBE_ADVERTISE_HOST (DNS-rebinding
    protection: a request for any other name is refused)."""

    tls_cert: str | None = None
    """PROBE_TLS_CERT: a PEM certificate (chain) file. With PROBE_TLS_KEY the TCP port speaks
    HTTPS (the unix socket stays plain: the kernel already vouches for its peer's uid)."""

    tls_key: str | None = None
    """PROBE_TLS_KEY: the PEM private key of PROBE_TLS_CERT."""

    run_dir: str = field(default_factory=runfiles.default_run_dir)
    """PROBE_RUN_DIR: holds ``<pid>.sock`` and ``<pid>.json`` for local discovery (`probe PID`)."""

    unix_socket: bool = True
    """PROBE_UNIX_SOCKET=0 turns the unix socket off (TCP only)."""

    tcp: bool = True
    """PROBE_TCP=0 serves the unix socket only."""

    query_timeout_ms: int = 10_000
    """PROBE_QUERY_TIMEOUT_MS: a query still running after this is interrupted (HTTP 408)."""

    max_rows: int = 10_000
    """PROBE_MAX_ROWS: rows returned per query before ``truncated`` is set."""

    max_result_bytes: int = 16 << 20
    """PROBE_MAX_RESULT_BYTES: bytes of one query's result (JSON or Arrow) before ``truncated``
    is set. Measured in DuckDB before a value reaches Python, so a huge value never does."""

    max_sql_bytes: int = 64 << 10
    """PROBE_MAX_SQL_BYTES: longest SQL text a query may send; longer is refused (HTTP 413)
    before it is parsed. Bounds the parse, which DuckDB's checker does holding the GIL."""

    max_eval_bytes: int = 64 << 10
    """PROBE_MAX_EVAL_BYTES: longest code an eval may send; longer is refused (HTTP 413)
    before it is compiled (CPython compiles holding the GIL)."""

    db_memory_mb: int | None = None
    """PROBE_DB_MEMORY_MB: DuckDB's memory_limit; a query needing more fails, not the rank.
    Unset: twice PROBE_RETENTION_MB plus 256 (``db_memory_limit_mb``): the step tables, the
    deleted rows retention has not freed yet and a checkpoint's copy, plus the queries' room."""

    db_threads: int = 1
    """PROBE_DB_THREADS: DuckDB worker threads. One keeps queries off the training cores."""

    retention_mb: int = 128
    """PROBE_RETENTION_MB: bytes kept in step-indexed tables; the oldest steps go first."""

    flush_ms: int = 2000
    """PROBE_FLUSH_MS: how often the writer thread moves collector buffers into DuckDB when
    nobody reads (a read flushes first, so this bounds cost, not freshness)."""

    trace: str = "every:10"
    """PROBE_TRACE: on | off | every:N. Module tracing mode at start (`probe trace` changes it)."""

    trace_native: str = "auto"
    """PROBE_TRACE_NATIVE: auto | off. auto: traced steps use the tracer's C++ hot path once it is
    built (in the background, once per machine and torch build; see trace_native.py); off: the
    Python hot path only, and no compiler is ever run."""

    eval_timeout_s: float = 30.0
    """PROBE_EVAL_TIMEOUT_S: an eval still running after this is interrupted and reported."""

    eval_output_bytes: int = 1 << 20
    """PROBE_EVAL_OUTPUT_BYTES: captured stdout/stderr of one eval is cut after this."""

    watchdog: bool = True
    """PROBE_WATCHDOG=0 disables the out-of-process stack reader: then the agent serves
    its public sockets itself, and a rank whose GIL is held answers nothing."""

    watchdog_grace_s: float = 600.0
    """PROBE_WATCHDOG_GRACE_S: how long the watchdog keeps answering (exit status, last stack,
    last step) after its rank died. A clean exit (code 0) ends it at once."""

    backtrace_deadline_ms: int = 1000
    """PROBE_BACKTRACE_DEADLINE_MS: a backtrace the in-process agent has not answered by then is
    answered out-of-process by the watchdog (py-spy, or a faulthandler dump)."""

    watchdog_reader: str = "auto"
    """PROBE_WATCHDOG_READER: auto | py-spy | faulthandler. How the watchdog reads stacks when the
    agent cannot; auto = py-spy, then faulthandler where ptrace is not permitted."""

    watchdog_snapshot_s: float = 5.0
    """PROBE_WATCHDOG_SNAPSHOT_S: how often the watchdog keeps a backtrace for crash forensics
    (from the in-process agent; py-spy only while the agent is frozen)."""

    action_timeout_s: float = 60.0
    """PROBE_ACTION_TIMEOUT_S: the longest a step-boundary action should hold the training thread
    (waiting for the other ranks to reach the step, then running). A waiting action is skipped
    on every rank past it; a running one cannot be stopped safely and is reported as overrunning."""

    serve_cpu: float = 0.02
    """PROBE_SERVE_CPU: the share of one core the agent's request-serving threads may use,
    averaged over time (bursts up to 1 s of CPU pass at once). Requests beyond it wait their
    turn; none is refused. It bounds what a crowd of clients costs the training loop through
    the GIL. 1 or more = no limit."""

    postmortem: str = "on"
    """PROBE_POSTMORTEM: on | always | off. on: an on-disk copy of the tables is kept while the
    rank runs and left behind when it dies (a clean exit removes it); always: a clean exit
    leaves it too; off: no copy."""

    postmortem_dir: str | None = None
    """PROBE_POSTMORTEM_DIR: where the copies go (a shared filesystem: every node writes to one
    place). Default: ``<run dir>/postmortem``."""

    postmortem_every_s: float = 10.0
    """PROBE_POSTMORTEM_EVERY_S: how often the copy is refreshed; a SIGKILLed rank's copy is at
    most this old."""

    postmortem_mb: int = 32
    """PROBE_POSTMORTEM_MB: the copy's budget per rank; the oldest rows are dropped past it."""

    @property
    def db_memory_limit_mb(self) -> int:
        """DuckDB's memory_limit in MB: PROBE_DB_MEMORY_MB, or derived from the retention."""
        if self.db_memory_mb is not None:
            return self.db_memory_mb
        return 2 * self.retention_mb + DB_QUERY_ROOM_MB

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise_config("PROBE_PORT", self.port, "a port between 0 and 65535 (0 = any free)")
        if not _TRACE_RE.match(self.trace):
            raise_config("PROBE_TRACE", self.trace, "one of on, off, every:N (N ≥ 1)")
        if self.trace_native not in ("auto", "off"):
            raise_config("PROBE_TRACE_NATIVE", self.trace_native, "auto or off")
        for name, value in (
            ("PROBE_QUERY_TIMEOUT_MS", self.query_timeout_ms),
            ("PROBE_MAX_ROWS", self.max_rows),
            ("PROBE_MAX_RESULT_BYTES", self.max_result_bytes),
            ("PROBE_MAX_SQL_BYTES", self.max_sql_bytes),
            ("PROBE_MAX_EVAL_BYTES", self.max_eval_bytes),
            ("PROBE_DB_MEMORY_MB", self.db_memory_limit_mb),
            ("PROBE_DB_THREADS", self.db_threads),
            ("PROBE_RETENTION_MB", self.retention_mb),
            ("PROBE_FLUSH_MS", self.flush_ms),
            ("PROBE_EVAL_OUTPUT_BYTES", self.eval_output_bytes),
        ):
            if value <= 0:
                raise_config(name, value, "a positive integer")
        if self.eval_timeout_s <= 0:
            raise_config("PROBE_EVAL_TIMEOUT_S", self.eval_timeout_s, "a positive number")
        if not self.serve_cpu > 0:
            raise_config("PROBE_SERVE_CPU", self.serve_cpu,
                         "a share of one core above 0 (0.02 = 2%; 1 = no limit)")
        if self.watchdog_reader not in ("auto", "py-spy", "faulthandler"):
            raise_config("PROBE_WATCHDOG_READER", self.watchdog_reader,
                         "one of auto, py-spy, faulthandler")
        for name, number in (
            ("PROBE_WATCHDOG_GRACE_S", self.watchdog_grace_s),
            ("PROBE_BACKTRACE_DEADLINE_MS", self.backtrace_deadline_ms),
            ("PROBE_WATCHDOG_SNAPSHOT_S", self.watchdog_snapshot_s),
        ):
            if number <= 0:
                raise_config(name, number, "a positive number")
        if self.postmortem not in ("on", "always", "off"):
            raise_config("PROBE_POSTMORTEM", self.postmortem, "one of on, always, off")
        if not self.postmortem_every_s > 0 or self.postmortem_mb <= 0:
            raise_config("PROBE_POSTMORTEM_EVERY_S / PROBE_POSTMORTEM_MB",
                         f"{self.postmortem_every_s} / {self.postmortem_mb}", "positive numbers")
        if self.action_timeout_s <= 0:
            raise_config("PROBE_ACTION_TIMEOUT_S", self.action_timeout_s, "a positive number")
        if self.token is not None and not self.token.strip():
            raise_config("PROBE_TOKEN", "''", "a non-empty token, or unset it")
        if (self.tls_cert is None) != (self.tls_key is None):
            missing = "PROBE_TLS_KEY" if self.tls_key is None else "PROBE_TLS_CERT"
            raise ConfigError(f"{missing} is not set: TLS needs both PROBE_TLS_CERT and "
                              "PROBE_TLS_KEY (PEM files), or neither")
        if self.tls_cert is not None:
            self.server_ssl_context()  # unreadable or mismatched files fail at start

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    def server_ssl_context(self) -> ssl.SSLContext:
        """The TCP port's TLS context (TLS 1.2+), from PROBE_TLS_CERT and PROBE_TLS_KEY."""
        for name, path in (("PROBE_TLS_CERT", self.tls_cert), ("PROBE_TLS_KEY", self.tls_key)):
            if not os.path.isfile(path or ""):
                raise ConfigError(f"{name}={path}: no such file (give a PEM file's path)")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(self.tls_cert, self.tls_key)  # type: ignore[arg-type]
        except (ssl.SSLError, OSError) as e:
            raise ConfigError(
                f"PROBE_TLS_CERT={self.tls_cert} / PROBE_TLS_KEY={self.tls_key} cannot be "
                f"loaded ({e}): expected a PEM certificate and its matching PEM private key"
            ) from None
        return ctx

    @property
    def loopback_only(self) -> bool:
        return is_loopback(self.host)

    @property
    def eval_allowed(self) -> bool:
        """eval is remote code execution: off loopback it needs a token."""
        return self.loopback_only or self.token is not None

    def with_(self, **changes: object) -> AgentConfig:
        return replace(self, **changes)  # type: ignore[arg-type]

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> AgentConfig:
        """Read the PROBE_* variables of ``settings.SETTINGS``; PROBE_PORT is a base port to
        which LOCAL_RANK is added, and PROBE_TOKEN_FILE names a file holding PROBE_TOKEN."""
        return cls(**environ_values(environ))  # type: ignore[arg-type]
