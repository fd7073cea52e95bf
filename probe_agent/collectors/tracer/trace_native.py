"""The tracer's C++ hot path (``trace_native.cpp``, ``trace_native_backward.cpp``): built once
per machine and torch build, then loaded by every process that traces; the Python hot path
(``trace_hot.py``) runs until then, and wherever it cannot be built.

Why C++: the Python wrapper and the per-node ``grad_fn`` pre-hooks cost the ~200 ms bench GPT
~1.8% of its step (a line profile), because between a model's kernels the caches are cold and
each bytecode costs 2-4x its warm figure. The C++ path records the same rows with a few hundred
machine instructions per call and no Python in backward at all (``trace_native.cpp``).

How it is built, and why this way:
- ``torch.utils.cpp_extension.load_inline`` compiles against the running torch's own headers, so
  there is no ABI to match and nothing to ship per torch version. The extension's name carries a
  hash of the source, the torch build and the Python version: another torch gets its own build.
- The compiler runs in a child process at the lowest CPU priority (``nice``), started from a
  daemon thread when a traced step first runs: the training process never imports
  ``cpp_extension`` (setuptools and friends), never waits for the build, and a failing compiler
  cannot hurt it. Ranks on one node share the cache; a lock the kernel releases at death makes
  one of them build while the others wait, and the builder dies with its rank
  (``native_build.py``). ``probe build-native`` builds ahead of time for a cluster image
  (``native_ahead.py``).
- It is cached under ``PROBE_NATIVE_DIR`` (default ``$XDG_CACHE_HOME/probe/native`` or
  ``~/.cache/probe/native``); a cached build is loaded in milliseconds.
- ``PROBE_TRACE_NATIVE=off`` keeps the Python path (no compiler is ever run). Without a C++
  compiler, or if the build fails, the tracer says so once in the log and in ``probe trace``'s
  state and ``probe info`` (``NativeLoader.describe``), and keeps the Python path.
- The native path serves CPU steps; a step with CUDA events recorded uses the Python path,
  which records the events (``trace_hot.py``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .native_build import BUILD_TIMEOUT_S, SOURCES, build, compiler
from .trace_columns import BW_N, FORWARD, FW_N, KEEP_STEPS, PASS_END, RECOMPUTE

log = logging.getLogger(__name__)
__all__ = ["BUILD_TIMEOUT_S", "LOADER", "NativeLoader", "SOURCES", "cache_dir", "compiler",
           "ext_name"]

#: What the build must report from ``layout()``: the record formats this Python reads.
LAYOUT = (FW_N, BW_N, PASS_END, FORWARD, RECOMPUTE, KEEP_STEPS)


def cache_dir(environ: Any = os.environ) -> Path:
    if environ.get("PROBE_NATIVE_DIR"):
        return Path(environ["PROBE_NATIVE_DIR"])
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "probe" / "native"


def ext_name(torch: Any) -> str:
    """The build's name: one per source, torch build and Python."""
    h = hashlib.sha256(b"".join(src.read_bytes() for src in SOURCES))
    for part in (torch.__version__, getattr(torch.version, "git_version", ""),
                 getattr(torch.version, "cuda", None) or "cpu", sys.version):
        h.update(str(part).encode())
    return f"probe_trace_native_{h.hexdigest()[:16]}"


class NativeLoader:
    """Loads the C++ hot path once per process (``request``), building it first if needed.

    ``module`` is the loaded extension once ready (else None); ``status`` is one of
    ``off``, ``idle``, ``building``, ``loading``, ``native``, or ``python: <why>``.
    """

    def __init__(self) -> None:
        self.module: Any = None
        self.status = "idle"
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.ready = threading.Event()  # set when loading ended, either way
        self.building_since = 0.0  # monotonic

    def describe(self) -> str:
        """What ``probe info`` and ``probe trace`` show: ``native``, or ``python (<why>)``:
        ``building, 40 s``, ``no compiler: ...``, ``build failed: see FILE``, ``off: ...``."""
        status = self.status
        if status == "native":
            return "native"
        if status == "building":
            return f"python (building, {time.monotonic() - self.building_since:.0f} s)"
        if status == "off":
            return "python (off: PROBE_TRACE_NATIVE=off)"
        if status == "idle":
            return "python (native not requested: tracing has not run)"
        return f"python ({status.removeprefix('python: ')})"

    def request(self, torch: Any, mode: str) -> None:
        """Start loading in the background unless it started already (``mode``: auto | off)."""
        with self._lock:
            if mode == "off":
                if self._thread is None:
                    self.status = "off"
                return
            if self._thread is not None:
                return
            if self.status == "off":
                self.status = "idle"
            self._thread = threading.Thread(target=self._load, args=(torch,), daemon=True,
                                            name="probe-native-build")
            self._thread.start()

    def _load(self, torch: Any) -> None:
        try:
            name = ext_name(torch)
            directory = cache_dir() / name
            so = directory / f"{name}.so"
            if not so.exists():
                self.building_since = time.monotonic()
                self.status = "building"
                build(name, directory)
            self.status = "loading"
            _check_owner(so)
            spec = importlib.util.spec_from_file_location(name, so)
            if spec is None or spec.loader is None:
                raise RuntimeError(f"cannot load {so}")
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            if tuple(mod.layout()) != LAYOUT:
                raise RuntimeError(f"{so} records {mod.layout()}, this agent reads {LAYOUT}")
            self.module = mod
            self.status = "native"
            log.info("probe agent: module tracing uses the C++ hot path (%s)", so)
        except Exception as e:  # noqa: BLE001 - a background thread: the Python path stays
            why = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            if not why.startswith(("build failed", "no compiler")):
                why = f"not loaded: {why}"
            self.status = f"python: {why[:300]}"
            log.warning("probe agent: module tracing keeps its Python hot path: the C++ one did "
                        "not build or load (%s); set PROBE_TRACE_NATIVE=off to skip it", why)
        finally:
            self.ready.set()


def _check_owner(so: Path) -> None:
    """Load only a build that nobody else could have replaced: the file and its directory are
    this user's and not writable by group or others (a shared PROBE_NATIVE_DIR would let
    another user put code into this process)."""
    for p in (so, so.parent):
        st = p.stat()
        if st.st_uid != os.getuid() or st.st_mode & 0o022:
            raise RuntimeError(f"{p} is not this user's alone (owner uid {st.st_uid}, mode "
                               f"{st.st_mode & 0o777:o}): not loaded; fix it or set "
                               f"PROBE_NATIVE_DIR to a private directory")


#: One per process: the extension's state is process-wide (trace_hot's fork handler unbinds it).
LOADER = NativeLoader()
