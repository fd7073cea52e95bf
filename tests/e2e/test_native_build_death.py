"""A rank killed while it builds the tracer's C++ hot path leaves nothing behind: its builder and
compiler die with it, the lock torch's build leaves is broken, and the next job builds and loads
the native path (native_build.py). One real build: about 40 s on a quiet 2-core machine."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import descendants, python_env, wait_until

torch = pytest.importorskip("torch")

from probe_agent.collectors.tracer.trace_native import (  # noqa: E402
    BUILD_TIMEOUT_S,
    NativeLoader,
    compiler,
    ext_name,
)

RANK = """
import sys, torch
from probe_agent.collectors.tracer.trace_native import LOADER
LOADER.request(torch, "auto")
print("requested", flush=True)
sys.stdin.read()  # a rank busy training, until it is killed
"""


def _alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (a zombie has finished)."""
    out = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.append(pid)
    return out


def _compiling(builder: int) -> list[int]:
    """The builder and everything under it, once a compiler (cc1plus) runs among them."""
    tree = [builder, *descendants(builder)]
    for pid in tree:
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
            if argv0.endswith((b"cc1plus", b"clang", b"clang++")):
                return tree
        except OSError:
            pass
    return []


def _builder(rank: int) -> int | None:
    for pid in descendants(rank):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"probe_agent.collectors.tracer.native_build" in argv and len(argv) >= 6:
            return pid
    return None


@pytest.mark.e2e
@pytest.mark.timeout(120 + 2 * BUILD_TIMEOUT_S)
def test_a_rank_killed_mid_build_takes_its_builder_and_the_next_job_loads_native(tmp_path,
                                                                                 monkeypatch):
    if compiler() is None:
        pytest.skip("no C++ compiler: the tracer keeps its Python hot path")
    cache = tmp_path / "native"
    monkeypatch.setenv("PROBE_NATIVE_DIR", str(cache))  # this process is the next job
    directory = cache / ext_name(torch)
    # CPython hands back the extension module it first loaded under a name, whatever the path
    # asked for (the new .so is mapped, its module is not used): where an earlier test in this
    # pytest process loaded the extension, the new build is checked on disk only
    loaded_before = f"/{ext_name(torch)}.so" in Path("/proc/self/maps").read_text()
    # GIVEN a rank whose builder is compiling (torch's build holds its plain-file lock)
    rank = subprocess.Popen([sys.executable, "-c", RANK], stdin=subprocess.PIPE, text=True,
                            env=python_env(PROBE_NATIVE_DIR=str(cache)))
    try:
        builder = wait_until(lambda: (directory / "lock").exists() and _builder(rank.pid), 120,
                             "the builder never took torch's build lock")
        tree = wait_until(lambda: _compiling(builder), 120, "the builder started no compiler")
        # WHEN the rank is killed (SIGKILL: nothing of it runs to clean up)
        rank.send_signal(signal.SIGKILL)
        rank.wait(10)
    finally:
        if rank.poll() is None:
            rank.kill()
            rank.wait()
        rank.stdin.close()
    # THEN its builder and the compiler under it die with it
    wait_until(lambda: not _alive(tree), 60, "the builder or its compiler outlived the rank")
    # AND torch's lock was left behind, fresh, and yet
    assert (directory / "lock").exists()
    assert not (directory / f"{ext_name(torch)}.so").exists()
    # WHEN the next job asks for the native path
    loader = NativeLoader()
    loader.request(torch, "auto")
    wait_until(lambda: loader.status != "idle", 60, "the loader never started")
    assert loader.status == "building", loader.describe()
    # THEN it says it is building, for how long, while it builds ...
    assert re.fullmatch(r"python \(building, \d+ s\)", loader.describe()), loader.describe()
    # ... and it builds and loads the native path
    assert loader.ready.wait(BUILD_TIMEOUT_S), loader.describe()
    assert loader.describe() == "native" and loader.module is not None, loader.describe()
    assert (directory / f"{ext_name(torch)}.so").exists()
    if not loaded_before:
        assert Path(loader.module.__file__).parent == directory
    assert not (directory / "lock").exists()
    # AND `probe build-native` (ahead of time, for an image) finds the build and says where
    out = subprocess.run([sys.executable, "-m", "probe_cli", "build-native"], text=True,
                         capture_output=True, timeout=300,
                         env=python_env(PROBE_NATIVE_DIR=str(cache)))
    assert out.returncode == 0, out.stderr
    assert str(directory) in out.stdout, out.stdout
