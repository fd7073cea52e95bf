"""This process's Flight Recorders read as ``python.collectives`` rows (collectives.py merges them
with its wrapper records).

torch keeps a ring of every collective each process group ran (``_dump_fr_trace`` for the CPU
backends, ``_dump_nccl_trace`` for NCCL with CUDA-event states). A dump is a pickle of dicts in
torch's own field names; this module turns them into the table's columns and states.
"""

from __future__ import annotations

import json
import logging
import pickle
import sys
from typing import Any

from .collective_names import callsite, fr_op

log = logging.getLogger(__name__)


def read_flight_recorder() -> tuple[list[dict[str, Any]], dict[str, dict[str, str]]] | None:
    """Entries of this process's Flight Recorders as row dicts, plus per-group status.

    Two recorders exist: the CPU one (gloo; ``_dump_fr_trace``) and, in CUDA builds, NCCL's
    (``_dump_nccl_trace``: CUDA-event states, so ``started``/``completed`` and end times).
    Returns None when torch.distributed is not in use or no recorder is available (buffer size
    0, a torch without them).
    """
    c10d_c = sys.modules.get("torch._C._distributed_c10d")
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    if c10d is None or not c10d.is_initialized():
        return None
    dumps = [getattr(c10d_c, n) for n in ("_dump_fr_trace", "_dump_nccl_trace")
             if hasattr(c10d_c, n)]
    entries: list[dict[str, Any]] = []
    status: dict[str, dict[str, str]] = {}
    seen = False
    for dump in dumps:
        try:
            data = pickle.loads(dump(True, True, False))
        except (RuntimeError, pickle.UnpicklingError, EOFError, TypeError) as e:
            log.debug("probe agent: flight recorder dump failed: %s", e)
            continue
        seen = True
        status.update(data.get("pg_status") or {})
        entries.extend(_fr_row(e) for e in data.get("entries", ()))
    return (entries, status) if seen else None


def _fr_row(e: dict[str, Any]) -> dict[str, Any]:
    pg_name, pg_desc = (list(e.get("process_group") or ("", "")) + ["", ""])[:2]
    is_p2p = bool(e.get("is_p2p"))
    start = e["time_created_ns"] / 1e9
    end = None
    if e.get("duration_ms") is not None and e.get("time_discovered_started_ns"):
        end = e["time_discovered_started_ns"] / 1e9 + e["duration_ms"] / 1e3  # NCCL timing
    elif e.get("time_discovered_completed_ns"):
        end = e["time_discovered_completed_ns"] / 1e9  # watchdog's view, NCCL only
    return {
        "pg": str(pg_name), "pg_desc": pg_desc,
        "seq": e.get("p2p_seq_id") if is_p2p else e.get("collective_seq_id"),
        "op": fr_op(e), "is_p2p": is_p2p,
        "shapes": json.dumps(e.get("input_sizes") or []),
        "dtype": _dtype((e.get("input_dtypes") or [None])[0]),
        "start_time": start, "end_time": end,
        "retired": bool(e.get("retired")), "fr_state": e.get("state"),
        "thread_name": e.get("thread_name"),
        "callsite": callsite(e.get("frames") or ()),
        "source": "flight_recorder",
    }


#: c10 ScalarType names (what the Flight Recorder writes) -> torch dtype names.
_DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16",
           "Long": "int64", "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8",
           "Bool": "bool", "ComplexFloat": "complex64", "ComplexDouble": "complex128"}


def _dtype(name: str | None) -> str | None:
    return _DTYPES.get(name, name.lower()) if name else None


def fr_state(e: dict[str, Any], status: dict[str, str]) -> str:
    if e.pop("fr_state", None) == "completed" or e.pop("retired", False):
        return "done"
    if not e["is_p2p"]:
        try:
            if int(e["seq"]) <= int(status.get("last_completed_collective", -1)):
                return "done"
        except (TypeError, ValueError):
            pass
    return "pending"
