"""OomRecorder: a CUDA out-of-memory caught in the act -> ``python.ooms`` and ``<pid>.oom.json``.

What gets captured
------------------
torch's caching allocator calls the observers attached with
``torch._C._cuda_attach_out_of_memory_observer`` as ``observer(device, alloc, device_allocated,
device_free)`` right before it raises ``torch.OutOfMemoryError``, on the thread that asked for
the memory (the training thread). At that moment the observer records:

- the failed request (``alloc``) and what the allocator says it holds on the device;
- the allocator's state: allocated, reserved, active and inactive-split bytes, the number of
  OOMs and retries (``memory_stats``), and the largest free block in its cache (from
  ``memory._snapshot()``'s segments) against the request: fragmentation when reserved minus
  allocated would cover the request but no single free block does;
- the last memory breakdown by kind (python.memory's last traced step: parameters, gradients,
  optimizer state, activations);
- the Python stack of the failing call (innermost last).

The record goes to the store (``python.ooms``) and, because the rank usually dies of the
exception, to ``<run_dir>/<pid>.oom.json`` (written whole: tmp + rename), which the watchdog
reads into the rank's exit record (crash forensics: `probe ps`, `probe PID`). When the allocator
history is being recorded (`probe memory --snapshot`), the snapshot is written beside it
(``<pid>.oom.pickle``, the format pytorch.org/memory_viz opens).

Nothing here creates a CUDA context: the observer is attached at the first step boundary that
finds CUDA already initialised by the job.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from probe_protocol.runfiles import RunFiles

from . import Guard, Sink
from .registry import CollectorSpec

TABLE = "python.ooms"
_MIB = 1 / 2**20


def largest_free_block(snapshot: dict[str, Any]) -> int:
    """The largest inactive block of the allocator's segments (``memory._snapshot()``)."""
    best = 0
    for seg in snapshot.get("segments", []):
        for block in seg.get("blocks", []):
            if block.get("state") == "inactive":
                best = max(best, int(block.get("size", 0)))
    return best


def oom_record(torch: Any, device: int, alloc: int, device_allocated: int, device_free: int,
               kinds: dict[str, Any], stack: list[str]) -> dict[str, Any]:
    """What an OOM observer saw, as a JSON-able dict (MiB)."""
    cuda = torch.cuda
    stats = cuda.memory_stats(device)
    snap = cuda.memory._snapshot(device)
    largest = largest_free_block(snap)
    allocated = stats.get("allocated_bytes.all.current", 0)
    reserved = stats.get("reserved_bytes.all.current", 0)
    cached = reserved - allocated
    total = cuda.get_device_properties(device).total_memory
    return {
        "timestamp": time.time(), "device": f"cuda:{device}",
        "request_mib": alloc * _MIB, "device_allocated_mib": device_allocated * _MIB,
        "device_free_mib": device_free * _MIB, "capacity_mib": total * _MIB,
        "allocated_mib": allocated * _MIB, "reserved_mib": reserved * _MIB,
        "active_mib": stats.get("active_bytes.all.current", 0) * _MIB,
        "inactive_split_mib": stats.get("inactive_split_bytes.all.current", 0) * _MIB,
        "largest_free_block_mib": largest * _MIB,
        # the cache could hold the request in total but in no one block: fragmentation
        "fragmented": bool(cached >= alloc > largest),
        "ooms": stats.get("num_ooms", 0), "alloc_retries": stats.get("num_alloc_retries", 0),
        **kinds, "stack": stack,
    }


class OomRecorder:
    """Collector for ``python.ooms``; see the module docstring.

    Args:
        stepclock: its step boundaries are where the observer gets attached (CUDA initialised
            by then, or not yet).
        rank: written into every row.
        run_dir: where ``<pid>.oom.json`` goes.
        kinds: returns the last breakdown by kind (MiB), from the step recorder.
    """

    def __init__(self, stepclock: Any, rank: int, run_dir: str,
                 kinds: Callable[[], dict[str, Any]]) -> None:
        self.stepclock = stepclock
        self.rank = rank
        self.run_dir = run_dir
        self.kinds = kinds
        self.guard = Guard("OOM observer")
        self.sink: Sink | None = None
        self.rows: list[dict[str, Any]] = []
        self.attached = False
        self.recording_history = False  # `probe memory --snapshot` is recording
        self._unsubscribe: Any = None
        self._lock = threading.Lock()

    def start(self, sink: Sink) -> None:
        self.sink = sink
        sink.add_flusher(self.flush)
        self._unsubscribe = self.stepclock.subscribe(self._on_step, "OOM observer")

    def stop(self) -> None:
        # torch has no detach: the observer stays and does nothing once the sink is gone
        if self._unsubscribe is not None:
            self._unsubscribe()
        self.flush()
        self.sink = None

    def _on_step(self, step: int, optimizer: Any) -> None:
        if self.attached:
            return
        torch = sys.modules.get("torch")
        cuda = getattr(torch, "cuda", None)
        if torch is None or cuda is None or not cuda.is_initialized():
            return
        attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
        if attach is None:
            return
        attach(self.observe)
        self.attached = True

    def observe(self, device: int, alloc: int, device_allocated: int, device_free: int) -> None:
        """The allocator's observer: runs inside the failing allocation; never raises."""
        if self.sink is None or not self.guard.enabled:
            return
        try:
            torch = sys.modules["torch"]
            stack = [f"{f.filename}:{f.lineno} {f.name}"
                     for f in traceback.extract_stack()[:-1]]
            rec = oom_record(torch, device, alloc, device_allocated, device_free,
                             self.kinds(), stack)
            rec["rank"] = self.rank
            rec["step"] = self.stepclock.current_step + 1 if self.stepclock.seen_step else 0
            rec["snapshot"] = self._dump_history(torch)
            self._write_file(rec)
            self.add(rec)
        except Exception as e:  # noqa: BLE001 - inside the allocator: never raise into it
            self.guard.failed(e)

    def add(self, rec: dict[str, Any]) -> None:
        """Queue one record (``oom_record``'s keys, plus rank, step, snapshot) for the table."""
        with self._lock:
            self.rows.append(rec)

    def _dump_history(self, torch: Any) -> str | None:
        if not self.recording_history:
            return None
        path = RunFiles(self.run_dir, os.getpid()).oom_snapshot
        with open(path, "wb") as f:
            pickle.dump(torch.cuda.memory._snapshot(), f)
        return path

    def _write_file(self, rec: dict[str, Any]) -> None:
        path = RunFiles(self.run_dir, os.getpid()).oom
        tmp = path + ".tmp"
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            json.dump(rec, f)
        os.replace(tmp, path)

    def flush(self) -> None:
        sink = self.sink
        with self._lock:
            rows, self.rows = self.rows, []
        if sink is None or not rows:
            return
        schema = sink.arrow_schema(TABLE)
        cols = {f.name: [r.get(f.name) for r in rows] for f in schema}
        cols["stack"] = ["\n".join(r.get("stack") or []) for r in rows]
        sink.append(TABLE, pa.table(cols, schema=schema))


#: This collector, for the registry (registry.py).
COLLECTOR = CollectorSpec(
    "oom", 50, needs=("steps",), tables=("python.ooms",),
    # the step recorder's per-kind memory of the last traced step, named in the OOM's row
    build=lambda b: OomRecorder(b.clock, b.rank, b.config.run_dir,
                                b.get("steps").last_kinds if b.get("steps") else dict))
