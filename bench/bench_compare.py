"""What `probe compare` costs: the time it takes on two 8-rank post-mortem copies (goal: under
5 s), and what keeping a clean run's copy (PROBE_POSTMORTEM=always) costs on disk.

Two real 8-rank torchrun jobs on gloo (tests/programs/compare_job.py under DDP, traced every
2nd step, --steps each), the second with one module slowed by --slow-ms, each leaving its copy
at its clean exit. Then `probe compare A B` runs --repeat times on the two directories; the
median and the range of its wall time are printed with the copies' bytes on disk per rank.
The refresh's cost on step time while a job runs is bench/bench_postmortem.py's (`always`
refreshes as `on` does; it only keeps the copy at a clean exit).

    PYTHONPATH=. python bench/bench_compare.py [--ranks 8] [--steps 200] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support import PROGRAMS, python_env  # noqa: E402


def run_job(base: Path, ranks: int, steps: int, slow_ms: float) -> Path:
    (base / "ready").mkdir(parents=True)
    (base / "run").mkdir(mode=0o700)
    env = python_env(PROBE="1", PROBE_PORT="0", PROBE_RUN_DIR=str(base / "run"),
                     PROBE_POSTMORTEM="always", PROBE_TRACE="every:2", OMP_NUM_THREADS="1",
                     PROBE_WATCHDOG="0")
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ranks}",
           "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0",
           str(PROGRAMS / "compare_job.py"), "--ready-dir", str(base / "ready"),
           "--steps", str(steps), "--slow-ms", str(slow_ms)]
    t0 = time.monotonic()
    subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=1800)
    print(f"  job {base.name}: {ranks} ranks x {steps} steps in {time.monotonic() - t0:.0f} s")
    (job,) = [p for p in (base / "run" / "postmortem").iterdir() if p.is_dir()]
    return job


def disk_bytes(path: Path) -> int:
    return sum(f.stat().st_blocks * 512 for f in path.rglob("*") if f.is_file())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--slow-ms", type=float, default=20.0)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="probe-bench-compare-"))
    a = run_job(tmp / "a", args.ranks, args.steps, 0.0)
    b = run_job(tmp / "b", args.ranks, args.steps, args.slow_ms)
    for name, job in (("A", a), ("B", b)):
        ranks = [d for d in job.iterdir() if d.is_dir()]
        per_rank = [disk_bytes(d) for d in ranks]
        print(f"  copy {name}: {len(ranks)} ranks, {statistics.median(per_rank) / 2**10:.0f} KiB "
              f"per rank on disk (median; max {max(per_rank) / 2**10:.0f} KiB)")
    times, code = [], None
    for _ in range(args.repeat):
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "probe_cli", "compare", str(a), str(b)],
                           env=python_env(), capture_output=True, text=True, timeout=300)
        times.append(time.monotonic() - t0)
        code, head = r.returncode, (r.stdout.splitlines() or [r.stderr])[0]
    print(f"probe compare on two {args.ranks}-rank copies: median {statistics.median(times):.2f} s "
          f"(min {min(times):.2f}, max {max(times):.2f}; {args.repeat} runs; load "
          f"{os.getloadavg()[0]:.1f}); exit {code}: {head}")


if __name__ == "__main__":
    main()
