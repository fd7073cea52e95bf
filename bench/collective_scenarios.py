"""The fault suite's collective scenarios (bench/verdicts.py imports ``SCENARIOS`` from here):
real 2-rank gloo jobs of tests/programs/collective_job.py, each healthy or with one known fault
around the collectives, judged live (the job is still up) or after death (``probe -t COPY``,
the post-mortem copy the job left), and scored against the label.

    .venv/bin/python bench/verdicts.py --only c_rank0_only,c_sizes,c_stall

Each scenario's ``run(work, lib, repeat)`` returns verdicts.py's ``Outcome`` rows, scored here:
the verdict kinds as verdicts.py reads them, the culprit ranks the label names (rank 0 for the
rank-0-only collective), and what a kind must say beyond that (the mismatch kind; doctor's
unused-parameter verdict and module).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.e2e.procs import kill_all  # noqa: E402
from tests.support import PROGRAMS, python_env  # noqa: E402


def _s(*kinds: str) -> frozenset[str]:
    return frozenset(kinds)


@dataclass(frozen=True)
class CollectiveScenario:
    name: str  # c_<collective_job.py scenario>
    expect: dict[str, frozenset[str]]
    allow: frozenset[str] = frozenset()
    culprits: tuple[int, ...] | None = None  # hang's culprits (None: not scored)
    mismatch: str | None = None  # hang's mismatch kind
    unused: tuple[str, tuple[str, ...]] | None = None  # doctor: (verdict, modules)
    says: tuple[str, ...] = ()  # what hang's headline must say (the worker and its line)
    dead: bool = False  # judged from the post-mortem copy
    healthy: bool = False
    args: tuple[str, ...] = ()
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def scenario(self) -> str:
        return self.name.removeprefix("c_")

    def run(self, work: Path, lib: str | None, repeat: int = 0) -> list[Any]:
        return _run(self, work)


QUIET = {"hang": _s(), "straggler": _s(), "doctor": _s()}
SCENARIOS = [
    CollectiveScenario("c_healthy", QUIET, healthy=True, args=("--at", "40")),
    CollectiveScenario("c_rank0_only", {"hang": _s("hang"), "doctor": _s("hang")},
                       allow=_s("ended"), culprits=(0,), mismatch="sizes", dead=True),
    CollectiveScenario("c_sizes", {"hang": _s("hang"), "doctor": _s("hang")},
                       allow=_s("ended"), culprits=(0, 1), mismatch="sizes", dead=True),
    CollectiveScenario("c_stall", {"hang": _s("hang"), "doctor": _s("hang")},
                       allow=_s("ended"), culprits=(1,), dead=True, args=("--timeout-s", "10")),
    CollectiveScenario("c_missing_init", {"hang": _s("hang"), "doctor": _s("hang")},
                       culprits=(1,)),
    CollectiveScenario("c_unused", {"doctor": _s("unused_params")}, allow=_s("ended", "hang"),
                       unused=("crash", ("aux",)), dead=True),
    CollectiveScenario("c_unused_found", QUIET, unused=("needed", ("aux",)),
                       args=("--at", "12")),
    CollectiveScenario("c_unused_none", QUIET, unused=("costs_time", ()), healthy=True,
                       args=("--at", "12")),
    CollectiveScenario("c_loader_stuck", {"hang": _s("hang"), "doctor": _s("hang")},
                       culprits=(1,), says=("from DataLoader worker 1 (pid ",
                                            "stuck in read_remote_shard (collective_job.py:")),
    # 2 workers per rank on a loaded 2-core node can really be the bottleneck: DATA-BOUND is
    # then true (a warning), not a false alarm; any hang, stall or straggler verdict is one
    CollectiveScenario("c_loader_healthy", QUIET, healthy=True, args=("--at", "40"),
                       allow=_s("dataloader")),
]


def _run(sc: CollectiveScenario, work: Path) -> list[Any]:
    from bench import verdicts as v

    ready, stop = work / "ready", work / "stop"
    ready.mkdir(parents=True)
    os.chmod(work, 0o700)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
           "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0",
           str(PROGRAMS / "collective_job.py"), "--scenario", sc.scenario,
           "--ready-dir", str(ready), "--stop-file", str(stop), *sc.args]
    env = python_env(PROBE="1", PROBE_PORT="0", PROBE_RUN_DIR=str(work / "run"),
                     PROBE_WATCHDOG="1", PROBE_WATCHDOG_GRACE_S="20", **sc.extra_env)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, cwd=str(work))
    try:
        if sc.dead:
            target = _dead_copy(proc, work / "run" / "postmortem")
        else:
            target = _live(proc, ready, sc)
        outcomes: dict[str, Any] = {}
        for command in ("hang", "doctor", "straggler"):
            if command not in sc.expect and not sc.unused:
                continue
            if command == "hang" and "hang" in sc.expect.get("hang", ()) and not sc.dead:
                until = time.monotonic() + 60  # named once the wait passes the job's rhythm
                while True:
                    o = v.read("hang", *v.probe(target, "--json", "hang"))
                    if o.kinds or time.monotonic() > until:
                        break
                    time.sleep(2)
            else:
                o = v.read(command, *v.probe(target, "--json", command))
            code, _, text = v.probe(target, command)
            o.text_exit = None if "Traceback" in text else code
            outcomes[command] = o
        for o in outcomes.values():
            score(sc, o)
        return list(outcomes.values())
    finally:
        stop.touch()
        kill_all(proc, work / "run")


def _live(proc: subprocess.Popen[str], ready: Path, sc: CollectiveScenario) -> str:
    from bench.verdicts import wait_ready

    infos = wait_ready(proc, ready, sc.name, 180)
    time.sleep(2.0)  # a few steps past the announcement (the first steps are recorded)
    url = next(i["url"] for i in infos if i.get("url"))
    return str(url).removeprefix("http://")


def _dead_copy(proc: subprocess.Popen[str], root: Path) -> str:
    try:
        proc.wait(180)
    except subprocess.TimeoutExpired:
        raise RuntimeError("the job did not die on its own") from None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        dirs = [p for p in root.glob("*") if p.is_dir()] if root.exists() else []
        if len(dirs) == 1 and all((dirs[0] / f"rank-{r}" / "death.json").exists()
                                  for r in range(2)):
            return str(dirs[0])
        time.sleep(0.2)
    raise RuntimeError(f"no post-mortem copy with both deaths under {root}")


def score(sc: CollectiveScenario, o: Any) -> None:
    want = sc.expect.get(o.command)
    if want is None and not (o.command == "doctor" and sc.unused):
        return
    want = want or _s()
    ok = want <= o.kinds <= want | sc.allow
    if o.command == "hang" and sc.culprits is not None and want:
        ok = ok and sorted(o.culprits) == list(sc.culprits)
    if o.command == "hang" and sc.says:
        ok = ok and all(part in o.headline for part in sc.says)
    if o.command == "hang" and sc.mismatch:
        ok = ok and (o.body.get("mismatch") or {}).get("kind") == sc.mismatch
    if o.command == "doctor" and not want and not sc.dead and not o.kinds:
        ok = ok and o.exit == 0  # healthy (or info only, or only what `allow` accepts): exit 0
    if o.command == "doctor" and sc.unused:
        verdict, modules = sc.unused
        found = [f.get("detail") or {} for f in o.body.get("findings", [])
                 if f.get("check") == "unused_params"]
        ok = ok and len(found) == 1 and found[0].get("verdict") == verdict and \
            tuple(found[0].get("modules") or ()) == modules
        o.headline += "; " + "; ".join(f"[{f['severity']}] {f['title']}"
                                       for f in o.body.get("findings", [])
                                       if f.get("check") == "unused_params")
    if o.text_exit not in (0, 3, 4):
        ok = False
    o.right = ok
