"""The disk side of the third red-team pass (issue 38): the post-mortem sweep and copy, the native
build directory, and reading a copy someone else packed. One function per finding, each
returning what the attacker (uid 65534, or a careless setting) got; bench/security_findings.py
runs them with the others, against this checkout or PROBE_SRC's.

Every function imports the code under test lazily (sys.path already points at it) and touches
only directories it made under /tmp.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from findings_support import cli as _cli

from tests.foreign import FOREIGN_UID, run_as

OLD = time.time() - 30 * 24 * 3600
ESC = "\x1b]0;pwned\x07\x1b[2J"


@contextlib.contextmanager
def _tmp(mode: int = 0o700) -> Iterator[Path]:
    d = Path(f"/tmp/probe-findings-{uuid.uuid4().hex[:8]}")
    d.mkdir()
    d.chmod(mode)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _owner_tree(home: Path) -> int:
    """An owner's old project and today's checkpoint (sparse: 8 GiB apparent); file count."""
    (home / "project-2019").mkdir(parents=True)
    (home / "project-2019" / "train.py").write_text("the owner's code\n")
    for p in (home / "project-2019" / "train.py", home / "project-2019"):
        os.utime(p, (OLD, OLD))
    (home / "today").mkdir()
    with open(home / "today" / "ckpt.pt", "wb") as f:
        f.truncate(8 << 30)
    return 2


def _files(home: Path) -> int:
    return sum(len(fs) for _, _, fs in os.walk(home))


def _with_agent(**kw: Any) -> None:
    """Start and stop an agent (its start sweeps the post-mortem root)."""
    import probe_agent
    from probe_agent.config import AgentConfig

    run_dir = tempfile.mkdtemp(prefix="probe-findings-")
    probe_agent.start(AgentConfig(run_dir=run_dir, watchdog=False, serve_cpu=1.0,
                                  trace_native="off", port=0, **kw))
    probe_agent.stop()
    shutil.rmtree(run_dir, ignore_errors=True)


def careless_root() -> str:
    with _tmp() as home:
        n = _owner_tree(home / "runs")
        _with_agent(postmortem_dir=str(home / "runs"))
        left = _files(home / "runs")
    return (f"PROBE_POSTMORTEM_DIR=$HOME/runs (an old project, an 8 GiB sparse checkpoint): "
            f"{n - left} of {n} owner files deleted")


def planted_root() -> str:
    with _tmp(0o1777) as shared, _tmp() as home:
        n = _owner_tree(home)
        before = set(os.listdir(home))
        run_as(FOREIGN_UID, os.symlink, str(home), str(shared / "pm"))
        _with_agent(postmortem_dir=str(shared / "pm"), postmortem="always")
        gone = n - _files(home)
        written = sorted(set(os.listdir(home)) - before)
    return (f"root planted as a link to the owner's home by uid 65534: {gone} of {n} owner "
            f"files deleted; copy written through the link: {'YES' if written else 'no'}")


def _plant_dir(path: str) -> bool:
    os.mkdir(path, 0o777)
    os.chmod(path, 0o777)
    return True


def foreign_run_dir() -> str:
    """/tmp/probe-<uid> made first by another uid (the run dir's own check skipped)."""
    with _tmp(0o1777) as shared:
        theirs = shared / f"probe-{os.getuid()}"
        run_as(FOREIGN_UID, _plant_dir, str(theirs))
        _with_agent(postmortem_dir=str(theirs / "postmortem"), postmortem="always")
        got = [p for p in theirs.rglob("*")]
    return (f"post-mortem root under a directory of uid 65534: {len(got)} entries of the "
            f"owner's copy written into it")


def _squat_build(build_dir: str, victim: str) -> bool:
    os.mkdir(build_dir, 0o777)
    os.chmod(build_dir, 0o777)
    os.symlink(victim, os.path.join(build_dir, "build.log"))
    return True


def native_build_dir() -> str:
    from probe_agent.collectors.tracer import native_build

    with _tmp(0o1777) as scratch, _tmp() as home:
        victim = home / "owner.txt"
        victim.write_text("the owner's file\n")
        build_dir = scratch / "probe_trace_native_0123456789abcdef"
        run_as(FOREIGN_UID, _squat_build, str(build_dir), str(victim))
        old_cxx, cwd = os.environ.get("CXX"), os.getcwd()
        os.environ["CXX"] = "/bin/false"  # a compiler that fails at once: the attack is the log
        os.chdir(home)  # the builder runs `python -m`: not this checkout's code from the cwd
        try:
            native_build.build(build_dir.name, build_dir)
            how = "built"
        except Exception as e:  # noqa: BLE001 - the refusal is the measurement
            how = f"{type(e).__name__}: {str(e)[:90]}"
        finally:
            os.chdir(cwd)
            if old_cxx is None:
                del os.environ["CXX"]
            else:
                os.environ["CXX"] = old_cxx
        kept = victim.read_text() == "the owner's file\n"
    return (f"build dir made first by uid 65534 with build.log -> owner's file: owner's file "
            f"{'kept' if kept else 'TRUNCATED'} ({how})")


def _copy(base: Path, **records: Any) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rank = base / "job" / "rank-0"
    rank.mkdir(parents=True)
    for d in (base, base / "job", rank):
        d.chmod(0o700)
    pq.write_table(pa.table({"step": [1], "duration": [0.1], "note": [ESC]}),
                   rank / "steps.1.parquet")
    meta = {"job": "job", "rank": 0, "world_size": 1, "refreshed_at": time.time(),
            "every_s": 10}
    for name, rec in {"meta": meta, **records}.items():
        (rank / f"{name}.json").write_text(json.dumps(rec))
    return base / "job"


def copy_sql() -> str:
    with _tmp() as d:
        job = _copy(d / "pm")
        evil = """x" AS SELECT 1; COPY (SELECT 42) TO 'pwned.csv'; CREATE VIEW "y.1.parquet"""
        shutil.copy(job / "rank-0" / "steps.1.parquet", job / "rank-0" / evil)
        cwd = os.getcwd()
        os.chdir(d)
        try:
            _cli("-t", str(job), "steps")
            ran = (d / "pwned.csv").exists()
            (d / "pwned.csv").unlink(missing_ok=True)
            (job / "rank-0" / evil).unlink()
            code, out, _ = _cli("-t", str(job), "query",
                                "SELECT count(*) AS n FROM read_csv('/etc/passwd')")
            code2, _, _ = _cli("-t", str(job), "query", "COPY (SELECT 42) TO 'copied.csv'")
            copied = (d / "copied.csv").exists()
        finally:
            os.chdir(cwd)
    return (f"a part's file name ran its SQL: {'YES' if ran else 'no'}; read_csv('/etc/passwd') "
            f"{'READ' if code == 0 else 'refused'}; COPY TO wrote a file: "
            f"{'YES' if copied else 'no'}")


def copy_escapes() -> str:
    with _tmp() as d:
        job = _copy(d / "pm", end={"kind": "exception", "at": time.time(),
                                   "exception": f"ValueError: {ESC}"})
        _, out, err = _cli("postmortem", str(d / "pm"))
        _, out2, err2 = _cli("-t", str(job), "query", "SELECT note FROM steps")
    raw = sum(t.count("\x1b") + t.count("\x07") for t in (out, err, out2, err2))
    return f"an OSC title + clear screen in end.json and a table cell: {raw} raw control bytes"


def copy_fifo() -> str:
    with _tmp() as d:
        job = _copy(d / "pm")
        (job / "rank-0" / "meta.json").unlink()
        os.mkfifo(job / "rank-0" / "meta.json")
        t0 = time.monotonic()
        try:
            subprocess.run([sys.executable, "-m", "probe_cli", "postmortem", str(d / "pm")],
                           capture_output=True, timeout=20, cwd=d, env={
                               **os.environ, "PYTHONPATH": os.environ.get("PROBE_SRC", "")
                               or str(Path(__file__).resolve().parents[1])})
            how = f"answered in {time.monotonic() - t0:.1f} s"
        except subprocess.TimeoutExpired:
            how = "HUNG (killed after 20 s)"
    return f"a FIFO as meta.json: probe postmortem {how}"


_RUN = """
import os, sys, time, torch.distributed as dist
dist.init_process_group("gloo")
time.sleep(2.0)  # a few refreshes of the copy (every 0.2 s), the run's name agreed
if sys.argv[1] == "raise":
    raise ValueError("the first run's crash")
dist.destroy_process_group()
"""


def runs_share_a_copy() -> str:
    with _tmp() as d:
        (d / "run").mkdir(mode=0o700)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        src = os.environ.get("PROBE_SRC") or str(Path(__file__).resolve().parents[1])
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("PROBE")},
               "PYTHONPATH": src, "PROBE": "1", "PROBE_PORT": "0",
               "PROBE_RUN_DIR": str(d / "run"), "PROBE_WATCHDOG": "0",
               "PROBE_POSTMORTEM_EVERY_S": "0.2", "PROBE_TRACE_NATIVE": "off",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0",
               "LOCAL_RANK": "0", "WORLD_SIZE": "1", "TORCHELASTIC_RUN_ID": "none"}
        for mode in ("raise", "clean"):
            subprocess.run([sys.executable, "-c", _RUN, mode], env=env, capture_output=True,
                           timeout=120, cwd=d)
        root = d / "run" / "postmortem"
        kept = [p for p in root.glob("*/rank-0/end.json")
                if "first run's crash" in p.read_text()] if root.exists() else []
    return (f"two runs on one port (run id 'none'), a crash then a clean exit: the crash's "
            f"copy {'kept' if kept else 'DELETED by the second run'}")


def full_disk() -> str:
    import pyarrow as pa

    from probe_agent.config import AgentConfig
    from probe_agent.postmortem.copy import PostmortemCopy
    from probe_agent.store.store import Store

    with _tmp() as d:
        tiny = d / "tiny"
        tiny.mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(tiny)],
                          capture_output=True).returncode:
            return "could not mount a 1 MiB tmpfs"
        store = Store(AgentConfig(port=0, retention_mb=64))
        store.start()
        try:
            schema = store.arrow_schema("python.metrics")

            def rows(first: int, n: int) -> None:
                store.append("python.metrics", pa.table({
                    "timestamp": [float(i) for i in range(first, first + n)],
                    "rank": [0] * n, "step": list(range(first, first + n)),
                    "name": ["loss"] * n, "value": [1.0] * n}, schema=schema))

            copy = PostmortemCopy(store, str(tiny / "root" / "j" / "rank-0"),
                                  lambda: {"job": "j"}, every_s=10.0, budget_bytes=1 << 30)
            rows(0, 100)
            copy.refresh()
            st = os.statvfs(tiny)
            with open(tiny / "hog", "wb") as f:
                f.write(b"\0" * (st.f_bfree * st.f_frsize))
            rows(100, 5000)
            copy.refresh()
            tmp = [p.name for p in (tiny / "root" / "j" / "rank-0").iterdir()
                   if p.name.endswith(".tmp")]
            (tiny / "hog").unlink()
            copy.refresh()
            import pyarrow.parquet as pq

            got = sum(pq.read_table(p).num_rows
                      for p in (tiny / "root" / "j" / "rank-0").glob("metrics.*.parquet"))
        finally:
            store.stop()
            subprocess.run(["umount", "-l", str(tiny)], check=False)
    return (f"a refresh on a full disk, then the disk freed: {got} of 5100 rows in the copy; "
            f"{len(tmp)} .tmp files left by the failed refresh")


FINDINGS: list[tuple[str, Callable[[], str]]] = [
    ("pm sweep careless", careless_root), ("pm root planted", planted_root),
    ("pm root foreign dir", foreign_run_dir), ("native build dir", native_build_dir),
    ("copy SQL", copy_sql), ("copy escapes", copy_escapes), ("copy FIFO meta", copy_fifo),
    ("runs share a copy", runs_share_a_copy), ("copy full disk", full_disk),
]
