"""The GPU check's out-of-memory: a child job under ``PROBE=1`` (watchdog and post-mortem copy
on) runs out of CUDA memory, and every place probe records it is read back (bench/gpu_check.py
runs ``python bench/gpu_oom.py --out DIR``).

1. `probe memory --snapshot --for 3 -o` while the job trains: the pickle opens with torch's own
   memory_viz (``python -m torch.cuda._memory_viz trace_plot`` and ``segment_plot``).
2. A second snapshot window is recording when the job allocates past the device: the rank dies
   of the uncaught ``torch.OutOfMemoryError``. Then: ``python.ooms`` in the post-mortem copy
   (`probe -t COPY query`), ``<pid>.oom.json`` and ``<pid>.oom.pickle`` in the run dir (the
   pickle through memory_viz too), and the dead rank's exit as the watchdog tells it
   (`probe backtrace` after the death: "CUDA out of memory at step ...").
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def job(ready: str, go: str) -> None:
    """The child: train on CUDA until ``go`` exists, then allocate until the device is full."""
    import torch

    import probe_agent.process

    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 1)).cuda()
    opt = torch.optim.AdamW(model.parameters())
    kept = []
    step = 0
    while True:
        opt.zero_grad(set_to_none=True)
        model(torch.randn(256, 1024, device="cuda")).sum().backward()
        opt.step()
        step += 1
        if step == 5:
            a = probe_agent.process.current()
            Path(ready).write_text(json.dumps({"url": a.url if a else None, "pid": os.getpid()}))
        if os.path.exists(go):
            kept.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))  # 1 GiB a step
        time.sleep(0.01)


def probe(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PROBE"}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "probe_cli", "--timeout", "30", *args],
                          capture_output=True, text=True, env=env, timeout=timeout)


def memory_viz(path: str, out: Path) -> dict[str, Any]:
    """Open a snapshot pickle with torch's own memory_viz CLI, both plots."""
    made = {}
    for plot in ("trace_plot", "segment_plot"):
        html = out / f"{Path(path).stem}.{plot}.html"
        r = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", plot, path,
                            "-o", str(html)], capture_output=True, text=True, timeout=120)
        made[plot] = html.stat().st_size if r.returncode == 0 and html.exists() else r.stderr[-300:]
    return {"ok": all(isinstance(v, int) and v > 1000 for v in made.values()), "html": made}


def wait_for(pred: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.2)
    raise TimeoutError(what)


def run(out: Path) -> list[dict[str, Any]]:
    run_dir, ready, go = out / "run", out / "ready.json", out / "go"
    env = dict(os.environ, PYTHONPATH=str(ROOT), PROBE="1", PROBE_PORT="0",
               PROBE_RUN_DIR=str(run_dir), PROBE_WATCHDOG="1", PROBE_POSTMORTEM="on",
               PROBE_TRACE="every:2")
    log = open(out / "job.log", "w")
    child = subprocess.Popen([sys.executable, __file__, "--job", "--out", str(out)], env=env,
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    results: list[dict[str, Any]] = []
    try:
        info = wait_for(lambda: ready.exists() and json.loads(ready.read_text()), 90,
                        "the job never became ready")
        url, pid = info["url"].removeprefix("http://"), info["pid"]
        r = probe("-t", url, "memory", "--snapshot", "--for", "3", "-o", str(out / "snap.pickle"))
        viz = memory_viz(str(out / "snap.pickle"), out) if r.returncode == 0 else {"ok": False}
        results.append({"name": "probe memory --snapshot opens in memory_viz", **viz,
                        "exit": r.returncode, "detail": r.stderr[-300:]})
        during = subprocess.Popen(  # recording while the OOM happens: its pickle goes beside
            [sys.executable, "-m", "probe_cli", "--timeout", "60", "-t", url, "memory",
             "--snapshot", "--for", "1000", "-o", str(out / "during.pickle")],
            env={**env, "PROBE": ""}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(2.0)  # the window starts at the next step boundary (10 ms steps)
        go.touch()
        code = child.wait(90)
        during.wait(90)
        text = (out / "job.log").read_text()
        results.append({"name": "the rank died of the OOM", "ok": code != 0
                        and "OutOfMemoryError" in text, "exit": code})
        files = json.loads(Path(run_dir, f"{pid}.oom.json").read_text()) \
            if Path(run_dir, f"{pid}.oom.json").exists() else None
        results.append({"name": "<pid>.oom.json", "ok": bool(files and files["request_mib"] > 0),
                        "record": {k: (files or {}).get(k) for k in (
                            "step", "device", "request_mib", "largest_free_block_mib",
                            "reserved_mib", "capacity_mib", "fragmented")}})
        pickle = Path(run_dir, f"{pid}.oom.pickle")
        results.append({"name": "<pid>.oom.pickle opens in memory_viz",
                        **(memory_viz(str(pickle), out) if pickle.exists()
                           else {"ok": False, "detail": "not written"})})
        bt = probe("-t", url, "backtrace")
        results.append({"name": "the watchdog tells the dead rank's exit", "ok":
                        "CUDA out of memory at step" in bt.stdout + bt.stderr,
                        "said": (bt.stdout + bt.stderr)[-600:]})
        copies = glob.glob(str(run_dir / "postmortem" / "*"))
        rows: Any = None
        if copies:
            q = probe("-t", copies[0], "--json", "query",
                      "SELECT step, request_mib, fragmented FROM python.ooms")
            rows = [row for b in json.loads(q.stdout or "[]") for row in b.get("rows", [])]
        results.append({"name": "python.ooms in the post-mortem copy", "ok": bool(rows),
                        "copy": copies[:1], "rows": rows})
    except Exception as e:  # report what was reached; the driver records the rest as failed
        results.append({"name": "oom check", "ok": False, "detail": f"{type(e).__name__}: {e}"})
    finally:
        if child.poll() is None:
            os.killpg(child.pid, 9)
            child.wait(10)
        log.close()
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--job", action="store_true", help="(internal) be the child job")
    args = p.parse_args()
    out = Path(args.out)
    if args.job:
        job(str(out / "ready.json"), str(out / "go"))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(run(out), indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
