"""Peak FLOP/s of the device a rank computes on, for MFU: a table for accelerators, a measured
matmul on CPU.

The table holds dense (no 2:4 sparsity) tensor-core peaks per dtype from each vendor's data
sheet; ``source`` names it. Names match ``torch.cuda.get_device_name()`` by substring, most
specific first (an "H100 PCIe" must not match the SXM row). A device or dtype not in the table
gets no peak (MFU stays NULL) rather than a guess.

On CPU there is no data sheet number torch can reach, so the rank measures one: the best of a
few square matmuls in the step's dtype, with the threads torch uses, once per node. The result
is kept in the run dir (``cpu_peak.json``, keyed by CPU model, threads and dtype) so the other
ranks of the node and later jobs reuse it; its source says "measured". It runs on the training
thread at a step boundary (~0.3 s, once): measured anywhere else it would compete with the
step it is meant to judge.

Ranks of a node share the file: every write is a read-modify-write under an exclusive
``flock`` on ``cpu_peak.json.lock``, merged key by key and replaced with a rename, so two ranks
measuring at once both land (a plain write kept only the last writer's keys), and a rank that
waited for the lock finds the other's measurement instead of running its own probe beside it
(two probes on the same cores would both read low). The lock is waited for at most
``LOCK_WAIT_S``: past that the rank goes on unlocked rather than stall its training.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

T = 1e12
#: The longest a rank waits for the node's cache lock (another rank's 0.3 s probe) before it
#: goes on without it.
LOCK_WAIT_S = 2.0
_NV = "NVIDIA data sheet"
_AMD = "AMD data sheet"
#: (name substring, {dtype: dense FLOP/s}, source), most specific first.
TABLE: list[tuple[str, dict[str, float], str]] = [
    ("H200", {"bfloat16": 989.4 * T, "float16": 989.4 * T, "tf32": 494.7 * T,
              "float32": 66.9 * T}, f"{_NV}: H200 SXM, dense"),
    ("H100 PCIe", {"bfloat16": 756.5 * T, "float16": 756.5 * T, "tf32": 378 * T,
                   "float32": 51.2 * T}, f"{_NV}: H100 PCIe, dense"),
    ("H100 NVL", {"bfloat16": 835.5 * T, "float16": 835.5 * T, "tf32": 417.5 * T,
                  "float32": 60 * T}, f"{_NV}: H100 NVL, dense"),
    ("H100", {"bfloat16": 989.4 * T, "float16": 989.4 * T, "tf32": 494.7 * T,
              "float32": 66.9 * T}, f"{_NV}: H100 SXM, dense"),
    ("A100", {"bfloat16": 312 * T, "float16": 312 * T, "tf32": 156 * T, "float32": 19.5 * T},
     f"{_NV}: A100 SXM/PCIe, dense"),
    ("L40S", {"bfloat16": 362.05 * T, "float16": 362.05 * T, "tf32": 183 * T,
              "float32": 91.6 * T}, f"{_NV}: L40S, dense"),
    ("A10G", {"bfloat16": 70 * T, "float16": 70 * T, "tf32": 35 * T, "float32": 31.2 * T},
     f"{_NV}: A10G, dense"),
    ("V100", {"float16": 125 * T, "float32": 15.7 * T}, f"{_NV}: V100 SXM2"),
    ("MI300X", {"bfloat16": 1307.4 * T, "float16": 1307.4 * T, "tf32": 653.7 * T,
                "float32": 163.4 * T}, f"{_AMD}: Instinct MI300X, dense"),
    ("MI250X", {"bfloat16": 383 * T, "float16": 383 * T, "float32": 95.7 * T},
     f"{_AMD}: Instinct MI250X"),
]


def table_peak(device_name: str, dtype: str | None) -> tuple[float, str] | None:
    """(FLOP/s, source) for a device name and dtype, or None when the table has no entry."""
    if not dtype:
        return None
    for key, peaks, source in TABLE:
        if key.lower() in device_name.lower():
            flops = peaks.get(dtype)
            return (flops, f"{source} {dtype}") if flops else None
    return None


class PeakFlops:
    """This rank's peak, found once per (device, dtype) the steps ran in.

    Args:
        run_dir: where the measured CPU peak is shared with the node's other ranks.
    """

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self._known: dict[tuple[str, str], tuple[float, str] | None] = {}

    def get(self, torch: Any, device: str | None, dtype: str | None) -> tuple[float, str] | None:
        """Training thread, at a step boundary. May measure the CPU once (see the module)."""
        if not device or not dtype:
            return None
        key = (device, dtype)
        if key in self._known:
            return self._known[key]
        if device == "cuda":
            name = torch.cuda.get_device_name(torch.cuda.current_device())
            found = table_peak(name, dtype)
        elif device == "cpu":
            found = self._cpu(torch, dtype)
        else:
            found = None
        self._known[key] = found
        return found

    def at_least(self, device: str | None, dtype: str | None,
                 achieved: float) -> tuple[float, str] | None:
        """The peak, raised to ``achieved`` where a step beat a measured CPU peak.

        The matmul probe runs once, for 0.3 s; on a node whose cores are busy at that moment it
        reads low, and every step after it would show an MFU above 100%. A step's own FLOP/s is
        then the best measured lower bound of the peak, so it replaces the probe's figure (here
        and in the node's cache). A data-sheet peak is never raised: beating it means the FLOP
        count or the clock is wrong, and the MFU above 100% shows that.
        """
        key = (device or "", dtype or "")
        found = self._known.get(key)
        if device != "cpu" or found is None or achieved <= found[0]:
            return found
        source = found[1].split(" (")[0] + " (raised to a step's own FLOP/s: the probe ran busy)"
        self._known[key] = (achieved, source)

        def raise_(cache: dict[str, Any]) -> None:
            for k in [k for k in cache if k.endswith(f"|{dtype}")]:
                cache[k] = max(float(cache[k]), achieved)

        update_cache(os.path.join(self.run_dir, "cpu_peak.json"), raise_)
        return self._known[key]

    def _cpu(self, torch: Any, dtype: str) -> tuple[float, str] | None:
        threads = torch.get_num_threads()
        # "cputime|": figures timed by wall clock alone (before) read low on a busy core and
        # were kept for the run dir; the new key leaves them behind, measured again once
        key = f"cputime|{_cpu_model()}|{threads}|{dtype}"
        found: list[float] = []

        def measure(cache: dict[str, Any]) -> None:
            # Under the node's lock: a rank that waited here finds the other's figure.
            if key not in cache:
                cache[key] = measure_cpu(torch, dtype)
            found.append(float(cache[key]))

        update_cache(os.path.join(self.run_dir, "cpu_peak.json"), measure)
        flops = found[0]
        return flops, f"measured: CPU {dtype} matmul, {threads} threads"


def measure_cpu(torch: Any, dtype: str, n: int = 1024, seconds: float = 0.3) -> float:
    """Best FLOP/s of n x n matmuls over about ``seconds``, each timed by the CPU time it used
    (the core's own rate, whether or not another process shared it).

    The operands come from a private generator: drawing them from torch's global one would
    move a seeded job's random numbers (its next batch, its dropout masks) the moment the
    agent first measured, so the same seed would give a different run under probe.
    """
    dt = getattr(torch, dtype, torch.float32) if dtype != "tf32" else torch.float32
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, dtype=dt, generator=gen)
    b = torch.randn(n, n, dtype=dt, generator=gen)
    torch.mm(a, b)  # warm: the first call picks kernels
    threads = max(1, torch.get_num_threads())
    # CPU time, not only wall time: on a node whose cores are shared at that moment the OS
    # takes the core away mid-matmul, and a wall clock read the probe 2.7x low (37 against
    # 100 GFLOP/s, kept for every later job of the run dir: MFU 37.5% for 14%). One thread's
    # matmul runs on this thread (thread_time); several share the process's CPU time. The
    # shorter of wall and CPU time is kept: other threads of the job busy at that moment add
    # process CPU time, and then the wall clock is the better (lower) bound.
    cpu = time.thread_time if threads == 1 else time.process_time
    best = 0.0
    end = time.perf_counter() + seconds
    while True:
        t0, c0 = time.perf_counter(), cpu()
        torch.mm(a, b)
        wall, used = time.perf_counter() - t0, (cpu() - c0) / threads
        dt_s = min(wall, used) if used > 0 else wall
        best = max(best, 2.0 * n ** 3 / dt_s)
        if time.perf_counter() > end:
            return best


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def _read(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def update_cache(path: str, change: Callable[[dict[str, Any]], None]) -> None:
    """Read ``path``, let ``change`` edit the dict, write it back atomically, all under the
    node's lock (see the module docstring). ``change`` runs even when the file cannot be
    written: the figure still holds for this rank."""
    with _locked(path + ".lock"):
        cache = _read(path)
        before = dict(cache)
        change(cache)
        if cache != before:
            _write(path, cache)


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        yield  # no lock file (read-only run dir): unlocked, as before
        return
    try:
        end = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() > end:
                    break  # never stall training for a cache: go on unlocked
                time.sleep(0.01)
        yield
    finally:
        os.close(fd)  # closing releases the flock


def _write(path: str, data: dict[str, Any]) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)  # atomic: a rank reading it sees the old or the new file
    except OSError:
        pass  # the peak still holds for this rank; others measure their own
