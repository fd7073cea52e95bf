"""The verdict fault suite (issue 14): real 2-rank torchrun jobs on gloo (CPU), each healthy or
with exactly one known fault, and every verdict command scored against the label.

    .venv/bin/python bench/verdicts.py                 # every scenario once
    .venv/bin/python bench/verdicts.py --repeat 3      # healthy scenarios 3 times each
    .venv/bin/python bench/verdicts.py --quick         # healthy, leak, hang_gil, slow_rank
    .venv/bin/python bench/verdicts.py --only leak,nan # a few by name

For each scenario the harness starts the job (``tests/programs/fault_job.py``), waits until it
is in the labelled state (the ranks announce a step; hang scenarios poll `probe hang` until it
names a hang, bounded), then runs `probe hang`, `probe straggler`, `probe doctor` (all
``--json``) and `probe memory`, maps each answer to verdict kinds (hang, straggler, memory,
nonfinite, dataloader, lr) and compares them with the label: right when every expected kind
is named, on the right rank, and nothing else is (a few symptoms of the same fault are
allowed, e.g. collective wait beside a straggler). It prints the confusion table (scenario x
command -> verdict, right or wrong) and precision and recall per verdict kind. Exit code 0 only
when every verdict is right.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.collective_scenarios import SCENARIOS as COLLECTIVE_SCENARIOS  # noqa: E402
from bench.lever_scenarios import lever_scenarios  # noqa: E402
from bench.numerics_scenarios import KINDS as NUMERICS_KINDS  # noqa: E402
from bench.numerics_scenarios import numerics_scenarios  # noqa: E402
from bench.shared_cpu_scenarios import shared_cpu_scenarios  # noqa: E402
from tests.e2e.procs import SPIN_C, kill_all  # noqa: E402 - the same GIL-holding C loop as the tests
from tests.support import PROGRAMS, kill_tree, python_env  # noqa: E402

#: doctor first: the leak must be named within 300 steps, and the job keeps stepping.
COMMANDS = ("doctor", "hang", "straggler")
#: doctor's check names -> verdict kinds (a stall is the doctor's view of a hang; collective
#: wait is what a straggler costs the others; an OOM is memory).
KIND = {"hang": "hang", "stall": "hang", "straggler": "straggler", "collectives": "straggler",
        "memory": "memory", "oom": "memory", "nonfinite": "nonfinite", "dataloader": "dataloader",
        "lr": "lr", "amp_clip": "amp_clip", "moe": "moe"}
ODD = 1  # the rank that misbehaves (the last of 2)


@dataclass(frozen=True)
class Scenario:
    name: str
    expect: dict[str, frozenset[str]]  # command -> kinds it must name (absent: not scored)
    allow: frozenset[str] = frozenset()  # kinds also tolerated (symptoms of the same fault)
    ready_step: int = 60
    step_s: float = 0.03
    hog: bool = False
    kill: bool = False
    trace: str = "off"  # PROBE_TRACE: memory by kind is counted on traced steps
    cause: tuple[str, str] | None = None  # doctor's memory_use: (cause, first lever) to name
    healthy: bool = False
    lib: bool = False
    #: text no doctor finding's next command may hold (own_lr: `probe lr` would be undone)
    forbid_next: str = ""
    #: throughput scenarios: the lever doctor's (info) LOW THROUGHPUT finding must name, or
    #: "none" (a compute-bound job: no throughput finding at all); "" = not scored
    lever: str = ""
    #: the program under tests/programs/ that runs the scenario
    program: str = "fault_job.py"
    #: doctor checks (or throughput levers) that may not appear at all, not even as information
    quiet: frozenset[str] = frozenset()
    #: (command, text) its answer must hold (a verdict's why, the layer it names)
    says: tuple[tuple[str, str], ...] = ()


def _s(*kinds: str) -> frozenset[str]:
    return frozenset(kinds)


NONE = {"hang": _s(), "straggler": _s(), "doctor": _s()}
# A hang is also asked for a straggler: none may be named from arrivals before the hang.
HANG = {"hang": _s("hang"), "doctor": _s("hang"), "straggler": _s()}
SCENARIOS = [
    Scenario("healthy", NONE, ready_step=300, step_s=0.01, healthy=True),
    Scenario("busy", NONE, ready_step=200, step_s=0.01, hog=True, healthy=True),
    Scenario("long_steps", NONE, ready_step=3, healthy=True),
    Scenario("uneven", NONE, ready_step=150, healthy=True),
    Scenario("slow_rank", {"hang": _s(), "straggler": _s("straggler"),
                           "doctor": _s("straggler")}, ready_step=40),
    Scenario("hang_sleep", HANG, ready_step=20),
    Scenario("hang_gil", HANG, ready_step=20, lib=True),
    Scenario("hang_dataloader", HANG, ready_step=20),
    Scenario("hang_collective", HANG, ready_step=20),
    Scenario("dead_rank", HANG, ready_step=20, kill=True),
    Scenario("nan", {"hang": _s(), "straggler": _s(), "doctor": _s("nonfinite")},
             allow=_s("lr"), ready_step=40),
    Scenario("leak", {"hang": _s(), "straggler": _s(), "doctor": _s("memory")},
             ready_step=250, step_s=0.01),
    Scenario("slow_input", {"hang": _s(), "straggler": _s(), "doctor": _s("dataloader")},
             ready_step=60, step_s=0.0),
    Scenario("lr_high", {"hang": _s(), "straggler": _s(), "doctor": _s("lr")},
             allow=_s("nonfinite", "spike", "diverging"), ready_step=60),
    Scenario("amp_scaled", {"hang": _s(), "straggler": _s(), "doctor": _s("amp_clip")},
             ready_step=60),
    Scenario("amp_unscaled", NONE, ready_step=60),
    Scenario("own_lr", {"hang": _s(), "straggler": _s(), "doctor": _s("lr")},
             allow=_s("nonfinite", "spike", "diverging"), ready_step=60, forbid_next="probe lr"),
    # memory use on CPU is information (no device to fill), so doctor must stay quiet and
    # still name the cause and the first lever in its memory_use finding
    Scenario("mem_activations", NONE, ready_step=40, step_s=0.0, trace="every:5",
             cause=("activations", "checkpoint")),
    Scenario("mem_optimizer", NONE, ready_step=40, step_s=0.0, trace="every:5",
             cause=("optimizer", "shard_optimizer")),
    Scenario("healthy_traced", NONE, ready_step=100, step_s=0.01, trace="every:5",
             healthy=True),
    # throughput: the lever named by doctor's LOW THROUGHPUT (info: a slow job is not broken);
    # the input-bound job's lever is DATA-BOUND's own finding (one problem, one finding)
    Scenario("tp_input", {"hang": _s(), "straggler": _s(), "doctor": _s("dataloader")},
             ready_step=40, step_s=0.0, trace="every:5"),
    Scenario("tp_comm", NONE, ready_step=40, step_s=0.0, trace="every:5", lever="collective"),
    Scenario("tp_host", NONE, ready_step=40, step_s=0.0, trace="every:5", lever="small_ops"),
    # checkpoint saves as the lever: a pause of the wall time, not a share of a traced step
    Scenario("tp_ckpt", NONE, ready_step=40, step_s=0.0, trace="every:5", lever="checkpoint"),
    Scenario("tp_healthy", NONE, ready_step=40, step_s=0.0, trace="every:5", lever="none",
             healthy=True),
]
SCENARIOS += lever_scenarios(Scenario)  # noqa: E305 - host syncs, compile, MoE, uneven batches
SCENARIOS += COLLECTIVE_SCENARIOS  # type: ignore[arg-type]  # each runs its own job (run())
SCENARIOS += numerics_scenarios(Scenario)  # loss spike, NaN origin, LR, clipping, schedule end
SCENARIOS += shared_cpu_scenarios(Scenario)  # ranks sharing busy cores, or pinned to their own
KIND.update(NUMERICS_KINDS)
QUICK = ("healthy", "leak", "hang_gil", "slow_rank")


@dataclass
class Outcome:
    command: str
    exit: int | None
    kinds: frozenset[str]
    culprits: list[int]
    headline: str
    right: bool | None = None  # None: not scored for this scenario
    body: dict[str, Any] = field(default_factory=dict)
    #: the same command's human output: its exit code (a crash is 1 with a traceback)
    text_exit: int | None = None


def probe(target: str, *args: str, timeout: float = 90) -> tuple[int | None, dict[str, Any], str]:
    cmd = [sys.executable, "-m", "probe_cli", "-t", target, "--timeout", "10", *args]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                             env=python_env())
    except subprocess.TimeoutExpired:
        return None, {}, "the command timed out"
    text = out.stdout.strip()
    try:
        body = json.loads(text) if text.startswith(("{", "[")) else {}
    except json.JSONDecodeError:
        body = {}
    return out.returncode, body, text or out.stderr.strip()


def _kind(f: dict[str, Any]) -> str:
    """A doctor finding's verdict kind; clipping's is its cause (growing norms: the LR)."""
    if f["check"] == "clipping" and (f.get("detail") or {}).get("cause") == "lr":
        return "lr"
    return KIND.get(f["check"], f["check"])


def read(command: str, code: int | None, body: dict[str, Any], text: str) -> Outcome:
    """One command's answer as verdict kinds and the ranks it blames."""
    if command == "doctor":
        bad = [f for f in body.get("findings", []) if f.get("severity") != "info"]
        kinds = frozenset(_kind(f) for f in bad)
        ranks = sorted({r for f in bad for r in f.get("ranks", [])})
        head = "; ".join(f"[{f['severity']}] {f['title']}" for f in bad) or "no problem found"
        mem = [f for f in body.get("findings", []) if f.get("check") == "memory_use"
               and f.get("severity") == "info"]
        if mem:
            head += f"; [info] {mem[0]['title']}"
        tput = [f for f in body.get("findings", []) if f.get("check") == "throughput"]
        if tput:
            head += f"; [info] {tput[0]['title']}"
        return Outcome(command, code, kinds, ranks, head, body=body)
    problem = bool(body.get("problem")) or code == 4
    kinds = frozenset({command} if problem else ())
    return Outcome(command, code, kinds, list(body.get("culprits") or []),
                   body.get("headline") or text.splitlines()[0] if text else "", body=body)


def score(sc: Scenario, o: Outcome) -> None:
    want = sc.expect.get(o.command)
    if want is None:
        return
    ok = want <= o.kinds <= want | sc.allow
    if o.command != "doctor" and want and o.culprits != [ODD]:
        ok = False  # the right verdict on the wrong rank is wrong
    if o.command == "doctor" and not want and not o.kinds & sc.allow:
        ok = ok and o.exit == 0  # healthy: exit 0, nothing above info (an allowed kind warns)
    if o.text_exit not in (0, 3, 4):
        ok = False  # the human output crashed (or timed out) where the JSON answered
    if o.command == "doctor" and sc.lever:
        levers = [(f.get("detail") or {}).get("lever") for f in o.body.get("findings", [])
                  if f.get("check") == "throughput"]
        ok = ok and levers == ([] if sc.lever == "none" else [sc.lever])
    if o.command == "doctor" and sc.quiet:  # no such check, nor such a throughput lever
        ok = ok and not any(f.get("check") in sc.quiet or (f.get("detail") or {}).get("lever")
                            in sc.quiet for f in o.body.get("findings", []))
    for command, text in sc.says:
        if command == o.command:
            ok = ok and text in json.dumps(o.body)
    if o.command == "doctor" and sc.forbid_next:
        ok = ok and not any(sc.forbid_next in (f.get("next") or "")
                            for f in o.body.get("findings", []))
    o.right = ok


def wait_ready(proc: subprocess.Popen[str], ready: Path, name: str, timeout_s: float,
               ranks: int = 2) -> list[dict[str, Any]]:
    """Each rank's announcement (``ready/rank{r}.json``: its agent's url and pid) once every
    rank has written one; raises when the job exits first or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while not all((ready / f"rank{r}.json").exists() for r in range(ranks)):
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise RuntimeError(f"{name}: the job exited early:\n{out}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name}: the ranks never became ready")
        time.sleep(0.2)
    return [json.loads((ready / f"rank{r}.json").read_text()) for r in range(ranks)]


def run(sc: Scenario, work: Path, lib: str | None, repeat: int = 0,
        asked: tuple[str, ...] = COMMANDS, memory: bool = True) -> list[Outcome]:
    """One run of ``sc``; repeats of a long healthy scenario are judged at different ages
    (x1, x0.5, x1.5 its ready step), where warm-up memory growth would fool a weak check.
    ``asked``: the verdict commands to run (a test asks only those it asserts on: each is two
    CLI runs, and a GIL-held rank makes doctor re-read for 8 s); ``memory``: `probe memory`'s
    summary line too."""
    if hasattr(sc, "run"):  # a scenario module's own job (bench/collective_scenarios.py)
        return sc.run(work, lib, repeat)
    if sc.healthy and sc.ready_step >= 100:
        sc = replace(sc, ready_step=int(sc.ready_step * (1.0, 0.5, 1.5)[repeat % 3]))
    ready, stop = work / "ready", work / "stop"
    ready.mkdir(parents=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
           "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0",
           str(PROGRAMS / sc.program), "--scenario", sc.name, "--ready-dir", str(ready),
           "--stop-file", str(stop), "--ready-step", str(sc.ready_step),
           "--step-s", str(sc.step_s), *(["--lib", lib] if sc.lib and lib else [])]
    # The watchdog reads a GIL-held rank's stack from outside (py-spy): on, as in production.
    env = python_env(PROBE="1", PROBE_PORT="0", PROBE_RUN_DIR=str(work / "run"),
                     PROBE_TRACE=sc.trace, PROBE_WATCHDOG="1", HF_HUB_OFFLINE="1")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    hogs: list[subprocess.Popen[bytes]] = []
    try:
        if sc.hog:  # one busy process per core, beside the job from the start
            hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                     start_new_session=True) for _ in range(os.cpu_count() or 2)]
        infos = wait_ready(proc, ready, sc.name,
                           180 + 10 * sc.ready_step * max(sc.step_s, 0.01))
        target = infos[0]["url"].removeprefix("http://")
        if sc.kill:
            os.kill(proc.pid, signal.SIGSTOP)  # as if the node's launcher died with the rank
            os.kill(infos[ODD]["pid"], signal.SIGKILL)
        outcomes: dict[str, Outcome] = {}
        if "hang" in sc.expect.get("hang", ()):
            # A hang is named once the wait exceeds the job's own rhythm: poll, bounded.
            until = time.monotonic() + 60
            while True:
                o = read("hang", *probe(target, "--json", "hang"))
                if o.kinds or time.monotonic() > until:
                    break
                time.sleep(2)
            outcomes["hang"] = o
        for command in (c for c in COMMANDS if c in asked):
            if command not in outcomes:
                outcomes[command] = read(command, *probe(target, "--json", command))
            # the text rendering too: `probe straggler` crashed there while --json was right
            code, _, text = probe(target, command)
            outcomes[command].text_exit = None if "Traceback" in text else code
        for o in outcomes.values():
            score(sc, o)
        if not memory:
            return list(outcomes.values())
        code, _, text = probe(target, "--csv", "memory")
        mem = Outcome("memory", code, frozenset(), [], memory_summary(text))
        return [*outcomes.values(), mem]
    finally:
        for h in hogs:
            kill_tree(h.pid)
            h.wait(10)
        stop.touch()
        try:
            os.kill(proc.pid, signal.SIGCONT)
        except OSError:
            pass
        kill_all(proc, work / "run")


def memory_summary(csv_text: str) -> str:
    """`probe --csv memory` in one line: each rank's job memory, robust slope, agent share."""
    import csv
    import io

    parts = []
    for row in csv.DictReader(io.StringIO(csv_text)):
        try:
            parts.append(f"rank {row['rank']}: job {row['mem_first_mib']}->{row['mem_last_mib']}"
                         f" MiB, {float(row['mem_mib_per_step']) * 1024:+.0f} KiB/step "
                         f"({row['rising_quarters']}/3 rising), agent {row['agent_first_mib']}"
                         f"->{row['agent_last_mib']} MiB")
        except (KeyError, ValueError, TypeError):
            continue
    return "; ".join(parts) or csv_text[:150]



def build_lib(tmp: Path) -> str | None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    src, lib = tmp / "spin.c", tmp / "libspin.so"
    src.write_text(SPIN_C)
    subprocess.run([cc, "-O1", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return str(lib)


def table(results: list[tuple[str, list[Outcome]]]) -> list[str]:
    lines = [f"{'scenario':<18} {'command':<10} {'exit':>4}  {'right':<6} verdict"]
    for name, outs in results:
        for o in outs:
            mark = {True: "right", False: "WRONG", None: "-"}[o.right]
            lines.append(f"{name:<18} {o.command:<10} {str(o.exit):>4}  {mark:<6} "
                         f"{o.headline[:170]}")
    return lines


def precision_recall(results: list[tuple[str, list[Outcome]]]) -> list[str]:
    by_name = {s.name: s for s in SCENARIOS}
    counts: dict[str, list[int]] = {}
    for name, outs in results:
        sc = by_name[name.split("#")[0]]
        for o in outs:
            want = sc.expect.get(o.command)
            if want is None:
                continue
            for k in set(KIND.values()):
                tp, fp, fn = counts.setdefault(k, [0, 0, 0])
                said, meant = k in o.kinds, k in want
                counts[k] = [tp + (said and meant), fp + (said and not meant and k not in sc.allow),
                             fn + (meant and not said)]
    lines = [f"{'verdict':<11} {'named':>5} {'false':>5} {'missed':>6} {'precision':>9} "
             f"{'recall':>6}"]
    for k, (tp, fp, fn) in sorted(counts.items()):
        prec = f"{tp / (tp + fp):.2f}" if tp + fp else "-"
        rec = f"{tp / (tp + fn):.2f}" if tp + fn else "-"
        lines.append(f"{k:<11} {tp:>5} {fp:>5} {fn:>6} {prec:>9} {rec:>6}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=1, help="runs of each healthy scenario")
    ap.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    ap.add_argument("--only", help="comma-separated scenario names")
    ap.add_argument("--show", action="store_true", help="print every verdict's details")
    args = ap.parse_args()
    names = set(args.only.split(",")) if args.only else set(QUICK) if args.quick else None
    chosen = [s for s in SCENARIOS if names is None or s.name in names]
    if names and (unknown := names - {s.name for s in SCENARIOS}):
        ap.error(f"unknown scenario(s): {', '.join(sorted(unknown))}; "
                 f"known: {', '.join(s.name for s in SCENARIOS)}")
    results: list[tuple[str, list[Outcome]]] = []
    with tempfile.TemporaryDirectory(prefix="probe-verdicts-") as tmp:
        lib = build_lib(Path(tmp))
        for sc in chosen:
            for i in range(args.repeat if sc.healthy else 1):
                label = f"{sc.name}#{i + 1}" if sc.healthy and args.repeat > 1 else sc.name
                t0 = time.monotonic()
                try:
                    outs = run(sc, Path(tmp) / f"{sc.name}-{i}", lib, i)
                except RuntimeError as e:
                    outs = [Outcome(c, None, frozenset(), [], f"not run: {e}"[:150], False)
                            for c in COMMANDS]
                results.append((label, outs))
                if args.show:
                    for o in outs:
                        print(f"--- {label} / {o.command} (exit {o.exit})\n"
                              + "\n".join([o.headline, *map(str, o.body.get("details") or
                                                            o.body.get("findings") or [])]))
                print(f"{label}: {time.monotonic() - t0:.0f} s; " + ", ".join(
                    f"{o.command} {'-' if o.right is None else 'ok' if o.right else 'WRONG'}"
                    for o in outs), flush=True)
    print("\n".join(["", *table(results), "", *precision_recall(results)]))
    wrong = sum(o.right is False for _, outs in results for o in outs)
    print(f"\n{wrong} wrong of {sum(o.right is not None for _, outs in results for o in outs)} "
          "scored verdicts")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
