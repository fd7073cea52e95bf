"""One command that runs every CUDA path of probe on a GPU and says what is right and wrong.

    python bench/gpu_check.py --out gpu-report            # on a GPU machine, < 8 min on an H100
    python bench/gpu_check.py --dry-run --out /tmp/gc     # anywhere: every check, and why skipped

Each check runs in a process of its own (a new session, killed with its group at its timeout),
so a crash, a hang or a CUDA error in one never stops the others; the whole run stops starting
checks when ``--budget-s`` is spent, and says which it skipped. ``--out`` gets ``report.json``
(every check: status, seconds, its sub-checks with the numbers compared) and ``summary.txt``
(one line per sub-check); each check's own output is under ``<out>/<check>/``. The exit code is 1
when any check failed or errored, else 0 (skipped checks do not fail the run). docs/gpu-check.md
says what each line means.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PY = sys.executable


@dataclass(frozen=True)
class Check:
    """One check: ``argv(out_dir)`` is its command (run from the repository root); it writes
    ``<out_dir>/result.json`` (a list of sub-checks) unless ``junit`` says pytest's report is
    its result. ``needs`` returns None when it can run here, else why not."""

    name: str
    why: str
    argv: Callable[[Path], list[str]]
    timeout_s: int
    needs: Callable[[], str | None]
    env: dict[str, str] = field(default_factory=dict)
    junit: bool = False


def _cuda() -> tuple[bool, int, str]:
    try:
        import torch
    except ImportError:
        return False, 0, "torch is not installed"
    if not torch.cuda.is_available():
        return False, 0, "no CUDA device (torch.cuda.is_available() is False)"
    return True, torch.cuda.device_count(), torch.cuda.get_device_name()


def needs_gpu(count: int = 1) -> Callable[[], str | None]:
    def check() -> str | None:
        ok, n, why = _cuda()
        if not ok:
            return why
        return None if n >= count else f"needs {count} GPUs, this machine has {n}"
    return check


def not_built(what: str) -> Callable[[], str | None]:
    return lambda: f"not in probe yet: {what}"


PROBE_ENV = {"PROBE": "1", "PROBE_PORT": "0", "PROBE_WATCHDOG": "0"}


def _gpt(mode: str, *extra: str) -> Callable[[Path], list[str]]:
    return lambda out: [PY, str(BENCH / "gpu_gpt.py"), mode, "--out", str(out), *extra]


def _cost(*extra: str) -> Callable[[Path], list[str]]:
    return lambda out: [PY, str(BENCH / "gpu_tracing_cost.py"), "--out", str(out), *extra]


CHECKS: list[Check] = [
    Check("cuda_tests", "the test suite's CUDA tests (marker `cuda`): CUDA-event rows, the "
          "allocator snapshot and the OOM record in-process, the CUDA throughput lever",
          lambda out: [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda",
                       "tests", f"--junitxml={out / 'junit.xml'}"], 240, needs_gpu(),
          junit=True),
    Check("gpt_one_process", "a GPT under PROBE=1, bf16 autocast, 1 process: module times, "
          "memory by kind, tokens/s, MFU, the lever's CUDA wording against torch's numbers",
          _gpt("one"), 150, needs_gpu(), env=PROBE_ENV),
    Check("gpt_two_processes", "the same GPT, 2 processes sharing the GPU over gloo (DDP): "
          "every rank's CUDA rows, hang and throughput across both",
          lambda out: [PY, "-m", "torch.distributed.run", "--nproc-per-node=2",
                       "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0",
                       str(BENCH / "gpu_gpt.py"), "two", "--out", str(out)],
          150, needs_gpu(), env=PROBE_ENV),
    Check("oom", "an OOM in a child job: python.ooms, the dead rank's exit, the post-mortem "
          "copy, <pid>.oom.json, and `probe memory --snapshot` pickles opened by memory_viz",
          lambda out: [PY, str(BENCH / "gpu_oom.py"), "--out", str(out)], 150, needs_gpu()),
    Check("tracing_cost_10ms", "tracing every module / default against off at a ~10 ms step, "
          "interleaved blocks", _cost("--target-ms", "10", "--rounds", "8"), 120,
          needs_gpu(), env=PROBE_ENV),
    Check("tracing_cost_100ms", "the same at a ~100 ms step",
          _cost("--target-ms", "100", "--rounds", "4", "--block", "5"), 150,
          needs_gpu(), env=PROBE_ENV),
    # Other issues' GPU parts: one line each (bench/gpu_check.py is theirs to extend).
    Check("host_syncs_cost", "the host-sync counter's cost on CUDA (issue 42's "
          "bench/bench_levers.py)", lambda out: [PY, str(BENCH / "bench_levers.py"),
                                                 "--device", "cuda", "--rounds", "10",
                                                 "--json", str(out / "result.json")],
          120, needs_gpu()),
    Check("nccl_collectives", "the collectives table and hang verdicts on NCCL (two ranks, "
          "one GPU each; NCCL refuses two ranks on one GPU)", lambda out: [], 0,
          not_built("a backend switch in tests/programs/collective_job.py (gloo only)")),
    Check("nvml_memory", "device memory outside the allocator (NVML) against "
          "torch.cuda.mem_get_info", lambda out: [], 0, not_built("NVML memory")),
]


def _junit(path: Path) -> list[dict[str, Any]]:
    import xml.etree.ElementTree as ET

    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        skip = case.find("skipped")
        out.append({"name": f"{case.get('classname')}::{case.get('name')}",
                    "ok": None if skip is not None else bad is None,
                    "seconds": float(case.get("time") or 0),
                    "detail": ((bad.get("message") if bad is not None else
                                skip.get("message") if skip is not None else "") or "")[:500]})
    return out


def run_check(check: Check, out: Path, timeout: float) -> dict[str, Any]:
    """Run one check in its own session; never raises."""
    where = out / check.name
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT), **check.env)
    env.setdefault("PROBE_RUN_DIR", str(where / "run"))
    t0 = time.monotonic()
    with open(where / "output.log", "w") as log:
        proc = subprocess.Popen(check.argv(where), cwd=ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code: int | None = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
            code = None
    took = round(time.monotonic() - t0, 1)
    tail = (where / "output.log").read_text(errors="replace")[-3000:]
    subs: list[dict[str, Any]] = []
    try:
        if check.junit and (where / "junit.xml").exists():
            subs = _junit(where / "junit.xml")
        elif (where / "result.json").exists():
            got = json.loads((where / "result.json").read_text())
            subs = got if isinstance(got, list) else [{"name": check.name, "ok": None, **got}]
    except (OSError, ValueError) as e:
        subs = [{"name": "result", "ok": False, "detail": f"unreadable: {e}"}]
    if code is None:
        status = "error"
        subs.append({"name": "timeout", "ok": False, "detail": f"killed after {timeout:.0f} s"})
    elif any(s.get("ok") is False for s in subs):
        status = "fail"
    elif code != 0 or not subs:
        status = "error"
        subs.append({"name": "exit", "ok": False, "detail": f"exit {code}: {tail[-800:]}"})
    else:
        status = "pass"
    return {"name": check.name, "why": check.why, "status": status, "seconds": took,
            "exit": code, "checks": subs}


def entry_points() -> list[dict[str, Any]]:
    """The dry run's own check that nothing it would run has rotted: each child script parses
    its arguments (``--help``: imports and argparse, no GPU needed)."""
    out = []
    for script in ("gpu_gpt.py", "gpu_oom.py", "gpu_tracing_cost.py", "bench_levers.py"):
        r = subprocess.run([PY, str(BENCH / script), "--help"], capture_output=True, text=True,
                           timeout=120, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        out.append({"name": script, "ok": r.returncode == 0, "detail": r.stderr[-300:]})
    return out


def summary_lines(report: dict[str, Any]) -> list[str]:
    mark = {True: "ok  ", False: "FAIL", None: "info"}
    lines = [f"probe GPU check: {report['device']} ({report['date']}); "
             f"{report['passed']} passed, {report['failed']} failed or errored, "
             f"{report['skipped']} skipped, {report['seconds']:.0f} s"]
    for c in report["checks"]:
        lines.append(f"{c['status'].upper():<7} {c['name']} ({c.get('seconds', 0)} s)"
                     + (f": {c['skipped']}" if c.get("skipped") else ""))
        if report["dry_run"]:
            lines.append(f"  what: {c['why']}")
            lines.append(f"  runs: {c.get('would_run') or '(nothing yet)'}")
        for s in c.get("checks", []):
            nums = {k: v for k, v in s.items() if k not in ("name", "ok", "detail")}
            lines.append(f"  {mark.get(s.get('ok'), '?   ')} {s['name']}"
                         + (f" {json.dumps(nums, default=str)[:300]}" if nums else "")
                         + (f" -- {s['detail'][:300]}" if s.get("detail") else ""))
    for e in report.get("entry_points", []):
        lines.append(f"{'ok  ' if e['ok'] else 'FAIL'} {e['name']} --help"
                     + (f" -- {e['detail']}" if not e["ok"] else ""))
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="directory for report.json and summary.txt")
    p.add_argument("--dry-run", action="store_true",
                   help="run nothing: list every check and why it would be skipped here")
    p.add_argument("--only", action="append", choices=[c.name for c in CHECKS],
                   help="run only this check (repeatable)")
    p.add_argument("--budget-s", type=float, default=450.0,
                   help="start no check once this much time is spent (default 450: ~7.5 min)")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _, _, device = _cuda()
    began = time.monotonic()
    results = []
    for check in CHECKS:
        if args.only and check.name not in args.only:
            continue
        why_not = check.needs()
        left = args.budget_s - (time.monotonic() - began)
        if why_not is None and left < 30:
            why_not = f"the budget ({args.budget_s:.0f} s) is spent"
        if args.dry_run and why_not is None:
            why_not = "dry run"
        if why_not is not None:
            results.append({"name": check.name, "why": check.why, "status": "skipped",
                            "skipped": why_not,
                            "would_run": " ".join(check.argv(out / check.name)) or None})
            continue
        print(f"gpu_check: {check.name} (up to {min(check.timeout_s, left):.0f} s)",
              file=sys.stderr, flush=True)
        results.append(run_check(check, out, min(check.timeout_s, left)))
    report = {"device": device, "date": time.strftime("%Y-%m-%d %H:%M"),
              "seconds": round(time.monotonic() - began, 1), "dry_run": args.dry_run,
              "passed": sum(r["status"] == "pass" for r in results),
              "failed": sum(r["status"] in ("fail", "error") for r in results),
              "skipped": sum(r["status"] == "skipped" for r in results), "checks": results}
    if args.dry_run:
        report["entry_points"] = entry_points()
        report["failed"] += sum(not e["ok"] for e in report["entry_points"])
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    text = "\n".join(summary_lines(report)) + "\n"
    (out / "summary.txt").write_text(text)
    print(text, end="")
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
