"""The agent's environment contract: which PROBE_* variable sets which AgentConfig field, and how
each is read from a mapping (``SETTINGS``, ``environ_values``).

Separate from config.py, which says what each setting means and which values are valid (the
AgentConfig dataclass): this module only turns variables into typed values, and refuses a value
it cannot parse with a message that names the variable. It also keeps the variables launchers
set for a rank's identity (``LOCAL_RANK_VARS`` and the like), which ranks.py and roles.py read
without needing a whole AgentConfig.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .errors import ConfigError

DEFAULT_BASE_PORT = 9700


# -- the settings table ------------------------------------------------------------------------
# One row per PROBE_* variable: the field of AgentConfig it sets and how it is read (each field's
# docstring in config.py says what it means). tests/unit/test_docs.py holds docs/settings.md's
# table to this one, datasette SETTINGS-style.

_UNSET = object()


def _given(environ: Mapping[str, str], name: str) -> object:
    """The value as given, when the variable is set at all (even empty)."""
    return environ[name] if name in environ else _UNSET


def _nonempty(environ: Mapping[str, str], name: str) -> object:
    return environ[name] if environ.get(name) else _UNSET


def _lowered(read: Callable[[Mapping[str, str], str], object]
             ) -> Callable[[Mapping[str, str], str], object]:
    def lower(environ: Mapping[str, str], name: str) -> object:
        value = read(environ, name)
        return value if value is _UNSET else str(value).strip().lower()
    return lower


def _path(environ: Mapping[str, str], name: str) -> object:
    # absolute: the watchdog runs in its own working directory
    return os.path.abspath(environ[name].strip()) if environ.get(name, "").strip() else _UNSET


def _names(environ: Mapping[str, str], name: str) -> object:
    if not environ.get(name, "").strip():
        return _UNSET
    return tuple(h.strip() for h in environ[name].split(",") if h.strip())


def _integer(default: int = 0) -> Callable[[Mapping[str, str], str], object]:
    def read(environ: Mapping[str, str], name: str) -> object:
        return _int(environ, name, default) if name in environ else _UNSET
    return read


def _number(environ: Mapping[str, str], name: str) -> object:
    return _float(environ, name) if name in environ else _UNSET


def _switch(environ: Mapping[str, str], name: str) -> object:
    return _bool(environ, name) if name in environ else _UNSET


@dataclass(frozen=True, slots=True)
class Setting:
    var: str
    field: str
    read: Callable[[Mapping[str, str], str], object]
    """(environ, var) -> the field's value, or _UNSET to keep its default."""


SETTINGS: tuple[Setting, ...] = (
    Setting("PROBE_HOST", "host", _given),
    Setting("PROBE_ADVERTISE_HOST", "advertise_host", _nonempty),
    Setting("PROBE_ALLOWED_HOSTS", "allowed_hosts", _names),
    Setting("PROBE_TLS_CERT", "tls_cert", _path),
    Setting("PROBE_TLS_KEY", "tls_key", _path),
    Setting("PROBE_RUN_DIR", "run_dir", _nonempty),
    Setting("PROBE_UNIX_SOCKET", "unix_socket", _switch),
    Setting("PROBE_TCP", "tcp", _switch),
    Setting("PROBE_QUERY_TIMEOUT_MS", "query_timeout_ms", _integer()),
    Setting("PROBE_MAX_ROWS", "max_rows", _integer()),
    Setting("PROBE_MAX_RESULT_BYTES", "max_result_bytes", _integer()),
    Setting("PROBE_MAX_SQL_BYTES", "max_sql_bytes", _integer()),
    Setting("PROBE_MAX_EVAL_BYTES", "max_eval_bytes", _integer()),
    Setting("PROBE_DB_MEMORY_MB", "db_memory_mb", _integer()),
    Setting("PROBE_DB_THREADS", "db_threads", _integer()),
    Setting("PROBE_RETENTION_MB", "retention_mb", _integer()),
    Setting("PROBE_FLUSH_MS", "flush_ms", _integer()),
    Setting("PROBE_TRACE", "trace", _lowered(_given)),
    Setting("PROBE_TRACE_NATIVE", "trace_native", _lowered(_nonempty)),
    Setting("PROBE_EVAL_TIMEOUT_S", "eval_timeout_s", _number),
    Setting("PROBE_EVAL_OUTPUT_BYTES", "eval_output_bytes", _integer()),
    Setting("PROBE_WATCHDOG", "watchdog", _switch),
    Setting("PROBE_WATCHDOG_GRACE_S", "watchdog_grace_s", _number),
    Setting("PROBE_BACKTRACE_DEADLINE_MS", "backtrace_deadline_ms", _integer(1000)),
    Setting("PROBE_WATCHDOG_READER", "watchdog_reader", _lowered(_nonempty)),
    Setting("PROBE_WATCHDOG_SNAPSHOT_S", "watchdog_snapshot_s", _number),
    Setting("PROBE_ACTION_TIMEOUT_S", "action_timeout_s", _number),
    Setting("PROBE_SERVE_CPU", "serve_cpu", _number),
    Setting("PROBE_POSTMORTEM", "postmortem", _lowered(_nonempty)),
    Setting("PROBE_POSTMORTEM_DIR", "postmortem_dir", _path),
    Setting("PROBE_POSTMORTEM_EVERY_S", "postmortem_every_s", _number),
    Setting("PROBE_POSTMORTEM_MB", "postmortem_mb", _integer()),
)
#: Read by environ_values itself (a port plus LOCAL_RANK; a token or the file holding it).
COMBINED = ("PROBE_PORT", "PROBE_TOKEN", "PROBE_TOKEN_FILE")
#: Read outside AgentConfig, where they are used: the .pth start-up switch, the py-spy binary
#: the watchdog and flame use, where the tracer's C++ hot path is cached, and the job label
#: of /v1/metrics when the launcher gives none.
ELSEWHERE = ("PROBE", "PROBE_PYSPY", "PROBE_NATIVE_DIR", "PROBE_JOB")


#: Where launchers put a process's rank on its node, in order of preference: torchrun and
#: deepspeed set LOCAL_RANK; srun sets only SLURM_LOCALID; Open MPI's mpirun its own.
LOCAL_RANK_VARS = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")
RANK_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")
WORLD_SIZE_VARS = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")


def first_set(environ: Mapping[str, str], names: tuple[str, ...]) -> str:
    """The first of ``names`` present in ``environ`` (the first name when none is)."""
    return next((n for n in names if environ.get(n, "").strip()), names[0])


def raise_config(name: str, value: object, expected: str) -> None:
    raise ConfigError(f"{name}={value!s} is invalid: expected {expected}")


def environ_values(environ: Mapping[str, str]) -> dict[str, object]:
    """AgentConfig's keyword arguments from the PROBE_* variables of ``SETTINGS`` that are set;
    PROBE_PORT is a base port to which LOCAL_RANK is added, and PROBE_TOKEN_FILE names a file
    holding PROBE_TOKEN."""
    kw: dict[str, object] = {}
    for setting in SETTINGS:
        value = setting.read(environ, setting.var)
        if value is not _UNSET:
            kw[setting.field] = value
    base = _int(environ, "PROBE_PORT", DEFAULT_BASE_PORT)
    local_rank = _int(environ, first_set(environ, LOCAL_RANK_VARS), 0)
    kw["port"] = 0 if base == 0 else base + local_rank
    token = environ.get("PROBE_TOKEN")
    if token is None and environ.get("PROBE_TOKEN_FILE"):
        token = _read_token_file(environ["PROBE_TOKEN_FILE"])
    kw["token"] = token
    return kw


def _int(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise_config(name, raw, "an integer")
        raise  # unreachable; keeps type checkers honest


def _float(environ: Mapping[str, str], name: str) -> float:
    raw = environ[name]
    try:
        return float(raw)
    except ValueError:
        raise_config(name, raw, "a number")
        raise


def _bool(environ: Mapping[str, str], name: str) -> bool:
    raw = environ[name].strip().lower()
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off", ""):
        return False
    raise_config(name, raw, "1 or 0")
    raise AssertionError


def _read_token_file(path: str) -> str:
    from .access import token_file_problem

    # As ssh does with key files: a token others can read is no secret.
    problem = token_file_problem(path)
    if problem is not None:
        raise ConfigError(f"PROBE_TOKEN_FILE: {problem}")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError as e:
        raise_config("PROBE_TOKEN_FILE", path, f"a readable file ({e.strerror})")
        raise
