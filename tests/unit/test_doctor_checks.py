"""`probe doctor`'s checks on hand-made rank answers: thresholds, wording, ranking, exit rule.
The same checks run on real programs in tests/e2e/test_doctor.py and test_troubleshooting.py."""

from __future__ import annotations

import pytest

from probe_cli.diagnose.doctor import diagnose
from probe_cli.diagnose.findings import RankDoc
from probe_cli.diagnose.hang import HangVerdict
from probe_cli.render.doctor import render

NO_HANG = HangVerdict(False, "no hang: none of 2 ranks has waited 5 s or more in a collective")
NOW = 1000.0


def doc(rank: int = 0, *, last_step_at: float = NOW - 0.1, loop: dict | None = None,
        memory: list | None = None, metrics: list | None = None, grads: dict | None = None,
        waiting: float | None = None, lr: object = 0.01, collectives=()) -> RankDoc:
    state = {"now": NOW, "clock": {"step": 40, "last_step_at": last_step_at},
             "loop": {"data_waiting_s": waiting},
             "optimizers": [{"class": "SGD", "groups": [{"lr": lr, "momentum": 0.9}]}],
             "cuda_total_mib": {"cuda:0": 81559.0}}
    base_loop = {"steps": 49, "step_ms": 20.0, "data_wait_share": 0.01, "clip_steps": 0}
    return RankDoc(rank, state=state, grads=grads or {"checked": True, "step": 41,
                                                        "nonfinite": 0, "params": 4},
                   loop=[{**base_loop, **(loop or {})}], memory=memory or [],
                   metrics=metrics or [], slow=[], collectives=tuple(collectives))


def checks(report) -> dict[str, str]:
    return {f.check: f.severity for f in report.findings}


def test_a_healthy_job_has_no_problem():
    # GIVEN two ranks stepping, flat memory, finite numbers
    flat = [mem_row(400.0, 401.0, 0.002, 0.0, 2)]
    report = diagnose(NO_HANG, [doc(0, memory=flat), doc(1, memory=flat)], 5.0)
    # THEN nothing but the LR information, and render says so
    assert not report.problem, report
    assert checks(report) == {"lr": "info"}
    assert "no problem found" in render(report, "probe doctor: ranks 0,1 answered")[0]


def test_a_rank_waiting_in_the_dataloader_is_stalled():
    report = diagnose(NO_HANG, [doc(0, last_step_at=NOW - 30, waiting=29.5)], 5.0)
    stall = next(f for f in report.findings if f.check == "stall")
    assert stall.severity == "critical" and stall.ranks == [0]
    assert stall.title.startswith("STALLED: rank 0 waits for the DataLoader")
    assert any("waiting for a batch in DataLoader __next__ for 29.5 s" in e
               for e in stall.evidence)


def test_a_slow_step_is_not_a_stall():
    # 3 s without a step is normal when steps take 1 s (STALL_STEPS x the median step)
    report = diagnose(NO_HANG, [doc(0, last_step_at=NOW - 6, loop={"step_ms": 1000.0})], 5.0)
    assert "stall" not in checks(report)


@pytest.mark.parametrize("bad", ["metrics", "grads", "clip"])
def test_nan_anywhere_is_critical_and_ranked_first(bad):
    kw = {
        "metrics": {"metrics": [{"name": "loss", "nonfinite": 3, "first_step": 30,
                                 "last_step": 32, "logged": 32, "last_finite": 0.8}]},
        "grads": {"grads": {"checked": True, "step": 33, "nonfinite": 2, "params": 4}},
        "clip": {"loop": {"nonfinite_grad_steps": 4, "first_nonfinite_step": 30,
                          "last_nonfinite_step": 33, "clip_steps": 4}},
    }[bad]
    kw["loop"] = {"data_wait_share": 0.6, **kw.get("loop", {})}
    report = diagnose(NO_HANG, [doc(0, **kw)], 5.0)
    ranked = report.ranked()
    assert ranked[0].check == "nonfinite" and ranked[0].severity == "critical"
    assert ranked[1].check == "dataloader"  # a warning comes after


def mem_row(first, last, slope, late, rising, first_step=250, last_step=1848, **extra):
    """One memory_growth row (its columns, as the agent answers them)."""
    return {"device": "cpu", "measure": "job RSS", "steps": last_step - first_step + 1,
            "first_step": first_step, "last_step": last_step, "mem_first_mib": first,
            "mem_last_mib": last, "mem_mib_per_step": slope, "late_mib_per_step": late,
            "rising_quarters": rising, "agent_first_mib": 3.9, "agent_last_mib": 8.2, "ooms": 0,
            **extra}


@pytest.mark.parametrize("row", [
    # the measured false alarm: a healthy job's RSS wandering 440.5 -> 459.4 -> 455.3 MiB
    mem_row(440.5, 455.3, 0.008, -0.004, 2),
    # warm-up: fast at first, then flattening (the second half grows far slower)
    mem_row(413.0, 440.0, 0.15, 0.03, 3, first_step=25, last_step=200),
    # steady but slow drift, below the minimum slope even over a long window
    mem_row(413.0, 450.0, 0.035, 0.035, 3, first_step=100, last_step=1100),
    # too few steps past warm-up to judge
    mem_row(413.0, 440.0, 0.5, 0.5, 3, first_step=11, last_step=50),
])
def test_healthy_memory_is_not_a_leak(row):
    report = diagnose(NO_HANG, [doc(0, memory=[row])], 5.0)
    assert "memory" not in checks(report), report


def test_a_steady_leak_is_named_with_its_evidence():
    # GIVEN 256 KiB kept every step, judged at step 300 (its first quarter left out)
    row = mem_row(415.1, 473.6, 0.26, 0.27, 3, first_step=75, last_step=300, heap_free_mib=41.5)
    report = diagnose(NO_HANG, [doc(0, memory=[row]), doc(1, memory=[row])], 5.0)
    mem = next(f for f in report.findings if f.check == "memory")
    assert mem.severity == "warning" and mem.ranks == [0, 1]
    assert mem.title == "MEMORY GROWTH: ranks 0,1 grow 266 KiB every step, steadily"
    assert "robust slope +0.260 MiB/step (+58.5 MiB)" in mem.evidence[0]
    assert "3/3 quarters rising" in mem.evidence[0]
    assert "the agent's own (DuckDB, Arrow) 3.9 -> 8.2 MiB, left out" in mem.evidence[0]
    assert "malloc's free heap (41.5 MiB at the end), left out" in mem.evidence[0]


def test_slow_cpu_growth_over_few_steps_waits_and_fast_growth_does_not():
    # GIVEN the measured false alarm: a healthy ZeRO-3 job probed hard on a loaded machine,
    # +31 MiB over steps 37-145 (the agent's requests in the job's heap), shaped like a leak
    probed = mem_row(527.3, 558.7, 0.256, 0.27, 3, first_step=37, last_step=145)
    report = diagnose(NO_HANG, [doc(0, memory=[probed]), doc(1, memory=[probed])], 5.0)
    # THEN doctor does not call it a leak yet, and says when it will judge it
    assert "memory" not in checks(report), report
    [line] = [u for u in report.unchecked if u.startswith("memory:")]
    assert "judged over 150 steps" in line and "527.3 -> 558.7 MiB" in line
    # AND the guide's leak, 1.8 MiB a step over 75 steps, is named at once
    fast = mem_row(484.8, 614.6, 1.85, 1.904, 3, first_step=26, last_step=101)
    assert checks(diagnose(NO_HANG, [doc(0, memory=[fast])], 5.0))["memory"] == "warning"
    # AND on CUDA (no agent share in allocated) the same slope over few steps is named
    cuda = {**probed, "device": "cuda:0", "measure": "CUDA allocated"}
    assert checks(diagnose(NO_HANG, [doc(0, memory=[cuda])], 5.0))["memory"] == "warning"


def test_memory_growth_and_cuda_headroom():
    rows = [mem_row(1000.0, 4200.0, 64.0, 64.0, 3, first_step=11, last_step=80,
                    device="cuda:0", measure="CUDA allocated", reserved_mib=4600.0)]
    report = diagnose(NO_HANG, [doc(0, memory=rows)], 5.0)
    mem = next(f for f in report.findings if f.check == "memory")
    assert mem.title == "MEMORY GROWTH: rank 0 grows 64.0 MiB every step, steadily"
    assert "headroom 76959 of 81559 MiB, full in ~1202 steps" in mem.evidence[0]


def test_oom_already_hit_is_critical():
    rows = [mem_row(1000.0, 1000.0, 0.0, 0.0, 0, first_step=11, last_step=80,
                    device="cuda:0", ooms=2, alloc_retries=7)]
    report = diagnose(NO_HANG, [doc(0, memory=rows)], 5.0)
    assert checks(report)["oom"] == "critical"


def test_clipping_far_below_the_norm_is_max_norm_and_a_zero_lr_is_not_too_high():
    # GIVEN rank 0 clips every step at a median norm 112x max_norm; rank 1 has an LR of 0
    clipping = doc(0, loop={"clip_steps": 49, "clipped_steps": 49, "clip_max_norm": 1.0,
                            "grad_norm_median": 112.0})
    report = diagnose(NO_HANG, [clipping, doc(1, lr=0.0)], 5.0)
    # THEN clipping names max_norm as the cause, and nothing suggests an LR cut
    clip = next(f for f in report.findings if f.check == "clipping")
    assert clip.severity == "warning" and "raise max_norm" in clip.next
    assert "the LR is not the problem" in clip.title and clip.detail["cause"] == "max_norm"
    lr = next(f for f in report.findings if f.check == "lr")
    assert lr.severity == "warning" and "lr is 0.0" in lr.title
    assert "too high" not in lr.title and all("--scale 0." not in f.next
                                              for f in report.findings)


def test_waiting_for_peers_in_collectives():
    # rank 1 arrives 80 ms after rank 0 at every collective of a 100 ms step
    def coll(rank, seq, t):
        return {"pg": "0", "seq": seq, "op": "allreduce", "state": "done", "start_time": t,
                "group_ranks": [0, 1]}
    r0 = [coll(0, s, s * 0.1) for s in range(1, 40)]
    r1 = [coll(1, s, s * 0.1 + 0.08) for s in range(1, 40)]
    report = diagnose(NO_HANG, [doc(0, collectives=r0), doc(1, collectives=r1)], 5.0)
    found = {f.check: f for f in report.findings}
    assert found["collectives"].ranks == [0]
    assert found["straggler"].ranks == [1]
    # AND the culprit leads: the straggler first, the waiting rank's finding points at it
    ordered = [f.check for f in report.ranked() if f.check in ("straggler", "collectives")]
    assert ordered == ["straggler", "collectives"], ordered
    assert found["collectives"].title.endswith("(rank 1, the straggler above)")


def test_waiting_by_turns_is_not_a_problem():
    # ranks arrive last by turns, 80 ms apart (a busy node): both wait, neither is to blame
    def coll(seq, t):
        return {"pg": "0", "seq": seq, "op": "allreduce", "state": "done", "start_time": t,
                "group_ranks": [0, 1]}
    r0 = [coll(s, s * 0.1 + (0.08 if s % 2 else 0.0)) for s in range(1, 40)]
    r1 = [coll(s, s * 0.1 + (0.0 if s % 2 else 0.08)) for s in range(1, 40)]
    report = diagnose(NO_HANG, [doc(0, collectives=r0), doc(1, collectives=r1)], 5.0)
    found = {f.check: f for f in report.findings}
    assert "straggler" not in found
    assert found["collectives"].severity == "info", found["collectives"]
    assert "no straggler to blame" in found["collectives"].title
    assert not report.problem


def test_a_hang_hides_the_timing_checks():
    hang = HangVerdict(True, "HANG: rank 0 waits in all_reduce #5 (group 0) for 9.0 s; rank 1 is "
                   "not in it", ["rank 1 has not reached all_reduce #5"], [1])
    report = diagnose(hang, [doc(0, last_step_at=NOW - 60), doc(1)], 5.0)
    assert [f.check for f in report.ranked()][0] == "hang"
    assert "stall" not in checks(report) and "straggler" not in checks(report)


def _at_step(d: RankDoc, step: int) -> RankDoc:
    d.state["clock"]["step"] = step
    return d


def test_a_schedule_seen_one_step_apart_is_not_a_disagreement():
    # GIVEN a cosine LR set every step (nanoGPT), ranks read one step apart: 4th digits differ
    report = diagnose(NO_HANG, [_at_step(doc(0, lr=5.9871e-4), 1349),
                                _at_step(doc(1, lr=5.9869e-4), 1350)], 5.0)
    # THEN no warning (this was "ranks disagree on optimizer settings" on a healthy job)
    assert checks(report) == {"lr": "info"}, report


@pytest.mark.parametrize("lr1,step1", [(5.9869e-4, 40), (3e-4, 41)])
def test_ranks_with_different_lrs_disagree(lr1, step1):
    # GIVEN the same step and another LR, or a step apart and half the LR (`probe lr` on one)
    report = diagnose(NO_HANG, [doc(0, lr=5.9871e-4), _at_step(doc(1, lr=lr1), step1)], 5.0)
    lr = next(f for f in report.findings if f.check == "lr")
    assert lr.severity == "warning" and "ranks disagree on optimizer settings" in lr.title
    assert lr.ranks == [0, 1]


def test_ranks_with_another_optimizer_shape_disagree_at_any_step():
    other = _at_step(doc(1), 41)
    other.state["optimizers"][0]["groups"][0]["momentum"] = 0.0
    report = diagnose(NO_HANG, [doc(0), other], 5.0)
    assert "ranks disagree" in next(f for f in report.findings if f.check == "lr").title


def _scaled_clip(rank: int, scaled_steps: int = 49) -> RankDoc:
    """A rank of minGPT-ddp: clip_grad_norm_ before scaler.unscale_ (its norm is x65536)."""
    return doc(rank, loop={"clip_steps": 49, "clipped_steps": 49, "clip_max_norm": 1.0,
                           "grad_norm_median": 4.59e4, "scaled_clip_steps": scaled_steps,
                           "grad_scale": 65536.0, "unscaled_norm_median": 0.7})


def test_clipping_scaled_gradients_is_named_instead_of_the_lr():
    # GIVEN both ranks clip every step on gradients the GradScaler has not unscaled
    report = diagnose(NO_HANG, [_scaled_clip(0), _scaled_clip(1)], 5.0)
    # THEN the finding is the missing unscale_, with the unscaled norm; no LR warning
    amp = next(f for f in report.findings if f.check == "amp_clip")
    assert amp.severity == "warning" and amp.ranks == [0, 1]
    assert "clipping scaled gradients" in amp.title.lower()
    assert "scaler.unscale_(optimizer) first" in amp.title and "unscaled 0.7" in amp.title
    assert "x65536" in amp.title
    lr = next(f for f in report.findings if f.check == "lr")
    assert lr.severity == "info" and "lr --scale 0.1" not in lr.next
    assert any("0.7 unscaled" in e for e in lr.evidence), lr.evidence


def test_clipping_after_unscale_is_judged_on_the_norm():
    # GIVEN the same norms, but unscale_ ran first (no step clipped scaled gradients)
    report = diagnose(NO_HANG, [_scaled_clip(0, 0), _scaled_clip(1, 0)], 5.0)
    # THEN no AMP finding; a norm far above max_norm on every step: raise max_norm
    assert "amp_clip" not in checks(report)
    assert checks(report)["clipping"] == "warning" and checks(report)["lr"] == "info"


def _own_lr(d: RankDoc, schedulers: list | None) -> RankDoc:
    d.state["schedulers"] = schedulers
    d.loop[0].update({"lr_first": 5.9e-4, "lr_last": 5.7e-4, "lr_changes": 49})
    return d


def test_a_loop_that_sets_its_own_lr_is_not_told_to_run_probe_lr():
    # GIVEN nanoGPT: no scheduler, the LR moves every step, and clipping on every step
    clip = {"clip_steps": 49, "clipped_steps": 49, "clip_max_norm": 1.0, "grad_norm_median": 9.0}
    docs = [_own_lr(doc(r, loop=clip, lr=lr), []) for r, lr in ((0, 5.9e-4), (1, 5.8e-4))]
    report = diagnose(NO_HANG, docs, 5.0)
    # THEN the advice is to change the script's schedule, never `probe lr`
    lr = next(f for f in report.findings if f.check == "lr")
    assert "probe lr" not in lr.next and "training script" in lr.next
    assert checks(report)["clipping"] == "warning"  # 9.0 vs max_norm 1.0: raise max_norm
    # (ranks at the same step count may hold the LRs of two steps: not a disagreement)
    assert "disagree" not in lr.title, lr.title
    assert any("sets it itself" in e for e in lr.evidence), lr.evidence
    # AND without a problem the info line does not suggest it either
    quiet = diagnose(NO_HANG, [_own_lr(doc(r), []) for r in (0, 1)], 5.0)
    assert "probe lr --scale" not in next(f for f in quiet.findings if f.check == "lr").next


def test_one_lr_change_is_not_a_loop_that_sets_its_own_lr():
    # GIVEN no scheduler and an LR halved once by `probe lr` (word_language_model with AdamW)
    docs = [_own_lr(doc(r), []) for r in (0, 1)]
    for d in docs:
        d.loop[0].update({"lr_first": 1e-3, "lr_last": 5e-4, "lr_changes": 1})
    lr = next(f for f in diagnose(NO_HANG, docs, 5.0).findings if f.check == "lr")
    # THEN the loop is not said to set its own LR, and `probe lr` stays the advice
    assert not any("sets it itself" in e for e in lr.evidence), lr.evidence
    assert "probe lr --scale 0.5" in lr.next


@pytest.mark.parametrize("schedulers", [["CosineAnnealingLR"], None], ids=["scheduler", "old"])
def test_a_scheduled_lr_still_gets_probe_lr(schedulers):
    report = diagnose(NO_HANG, [_own_lr(doc(r), schedulers) for r in (0, 1)], 5.0)
    assert "probe lr --scale 0.5" in next(f for f in report.findings if f.check == "lr").next


def _deepspeed_doc(rank: int, **ds) -> RankDoc:
    d = doc(rank)
    d.state["deepspeed"] = {"zero_stage": 3, "gradient_clipping": 1.0,
                            "gradient_accumulation_steps": 2, "fp16": False,
                            "global_steps": 40, "skipped_steps": 0, "loss_scale": None, **ds}
    return d


def test_deepspeed_clipping_and_accumulation_are_known():
    """DeepSpeed clips inside engine.step() (gradient_clipping), never through
    clip_grad_norm_: doctor says so instead of "clip_grad_norm_ not called"."""
    report = diagnose(NO_HANG, [_deepspeed_doc(0), _deepspeed_doc(1)], 5.0)
    lr = next(f for f in report.findings if f.check == "lr")
    assert lr.severity == "info" and not report.problem
    text = "\n".join(lr.evidence)
    assert "clip_grad_norm_ not called" not in text
    assert "ranks 0,1: DeepSpeed clips gradients inside engine.step() (gradient_clipping=1" in text
    assert "gradient accumulation 2: one optimizer step every 2 micro batches" in text


def test_deepspeed_fp16_scaler_skipping_most_steps_is_a_warning():
    healthy = _deepspeed_doc(0, fp16=True, loss_scale=65536.0, skipped_steps=3)
    stuck = _deepspeed_doc(1, fp16=True, loss_scale=1.0, skipped_steps=35,
                           gradient_clipping=0.0)
    report = diagnose(NO_HANG, [healthy, stuck], 5.0)
    lr = next(f for f in report.findings if f.check == "lr")
    assert lr.severity == "warning" and lr.ranks == [1], lr
    assert "rank 1: DeepSpeed's fp16 loss scaler skipped 35 of 40 steps" in lr.title
    assert any("rank 0: fp16 loss scale 65536; the scaler skipped 3 of 40" in e
               for e in lr.evidence)
    assert any("rank 1: DeepSpeed gradient_clipping is off" in e for e in lr.evidence)


def _stuck_verdict() -> HangVerdict:
    from probe_cli.diagnose.hang import RankState
    from probe_cli.diagnose.hang import diagnose as hang_diagnose

    spin = {"func": "forward", "file": "/job/train.py", "lineno": 7}
    main = {"func": "<module>", "file": "/job/train.py", "lineno": 90}
    return hang_diagnose([RankState(r, frames=(spin, main), coll_error="HTTP 504",
                                    route="py-spy") for r in (0, 1)])


def test_ranks_blamed_for_a_held_gil_that_keep_stepping_are_busy_not_stuck():
    # GIVEN a busy node: both ranks' collectives read timed out (the watchdog answered)
    verdict = _stuck_verdict()
    assert verdict.headline.startswith("STUCK: ranks 0,1 do not run Python")
    # WHEN both then answer doctor's round with a step finished 0.3 s earlier
    report = diagnose(verdict, [doc(0, last_step_at=NOW - 0.3), doc(1, last_step_at=NOW - 0.3)],
                      5.0)
    # THEN no hang is reported, and the note says why
    assert "hang" not in checks(report), report.findings
    note = next(x for x in report.fine if x.startswith("hang: "))
    assert "kept stepping" in note and "busy node" in note


def test_ranks_blamed_for_a_held_gil_that_stopped_stepping_stay_stuck():
    # GIVEN the same reads, but rank 1's last step is 60 s old (its GIL really is held)
    report = diagnose(_stuck_verdict(), [doc(0, last_step_at=NOW - 0.3),
                                         doc(1, last_step_at=NOW - 60)], 5.0)
    hang = next(f for f in report.findings if f.check == "hang")
    assert hang.severity == "critical" and hang.title.startswith("STUCK")


def test_a_copy_without_optimizer_settings_but_with_steps_does_not_say_none_stepped():
    # GIVEN a post-mortem rank: no live state (refused), 216 steps recorded with their LR
    d = doc(0, loop={"steps": 216, "last_step": 4731, "lr_first": 3e-4, "lr_last": 1e-4})
    d.state = None
    d.errors["state"] = "the live loop state is not in a post-mortem copy"
    report = diagnose(NO_HANG, [d], 5.0)
    line = next(u for u in report.unchecked if u.startswith("learning rate: "))
    # THEN it says why the settings are missing and what was recorded, not "no optimizer"
    assert "no optimizer has stepped yet" not in line, line
    assert "not in a post-mortem copy" in line and "216 steps to step 4731" in line
    assert "0.0003 -> 0.0001" in line


def test_ranks_whose_answers_timed_out_are_not_said_to_have_no_steps():
    """A busy node: the second round's state and loop queries timed out on every rank. Seen on
    the demo job with 274 rows in python.step_stats: "no optimizer has stepped yet" and "no
    steps in python.step_stats yet"."""
    # GIVEN ranks that answered neither their live state nor the loop query
    docs = [doc(r) for r in (0, 1)]
    for d in docs:
        d.state, d.loop = None, None
        d.errors.update(state="timeout 5 s", loop="timeout 5 s")
    report = diagnose(NO_HANG, docs, 5.0)
    # THEN "not checked" says they were not read, and why
    lr = next(u for u in report.unchecked if u.startswith("learning rate: "))
    data = next(u for u in report.unchecked if u.startswith("DataLoader wait: "))
    assert "not read (timeout 5 s)" in lr and "stepped yet" not in lr, lr
    assert data == "DataLoader wait: not read (timeout 5 s)", data


def test_overlapping_collectives_never_wait_more_than_the_window():
    # GIVEN DDP-style buckets: 3 all-reduces in flight at once each step; rank 0 enters them
    # 1 ms apart, rank 1 enters them 90 ms later (rank 1 is slow)
    def coll(seq, t):
        return {"pg": "0", "seq": seq, "op": "allreduce", "state": "done", "start_time": t,
                "group_ranks": [0, 1]}
    r0, r1 = [], []
    for step in range(1, 15):
        for b in range(3):
            seq = step * 3 + b
            r0.append(coll(seq, step * 0.1 + b * 0.001))
            r1.append(coll(seq, step * 0.1 + 0.09 + b * 0.001))
    report = diagnose(NO_HANG, [doc(0, collectives=r0), doc(1, collectives=r1)], 5.0)
    found = {f.check: f for f in report.findings}
    # THEN rank 0's wait is a share of the window it can be: at most 100%
    text = " ".join([found["collectives"].title, *found["collectives"].evidence])
    import re
    shares = [int(x) for x in re.findall(r"(\d+)% of the time", text)]
    assert shares and max(shares) <= 100, text


@pytest.mark.parametrize("loop, since", [
    # every step of the 50 read had a NaN gradient norm: it began at step 199 or before
    ({"nonfinite_grad_steps": 50, "steps": 50, "first_nonfinite_step": 199,
      "last_nonfinite_step": 248}, "since step 199 or earlier (the first step read)"),
    # a NaN that began inside the window is dated
    ({"nonfinite_grad_steps": 10, "steps": 50, "first_nonfinite_step": 239,
      "last_nonfinite_step": 248}, "since step 239"),
])
def test_nan_since_says_when_the_window_began_not_the_nan(loop, since):
    report = diagnose(NO_HANG, [doc(0, loop={**loop, "clip_steps": 50})], 5.0)
    [nan] = [f for f in report.findings if f.check == "nonfinite"]
    assert nan.title.endswith(since), nan.title
    if "earlier" not in since:
        assert "earlier" not in nan.title


def test_a_nan_origin_that_was_not_re_run_does_not_say_received():
    # GIVEN NaN at the job's very first step, before the tracer had seen the root model (the
    # FSDP2 example on CPU): no re-run happened
    first = {"step": 1, "loss": "nan", "grad_norm": "nan", "stage": "unchecked",
             "note": "no root model seen yet (the tracer names it at the first step it wraps)"}
    docs = [doc(r) for r in (0, 1)]
    for d in docs:
        d.state["numerics"] = {"first_nonfinite": first}
    report = diagnose(NO_HANG, docs, 5.0)
    [nan] = [f for f in report.findings if f.check == "nonfinite"]
    # THEN it says no re-run was done, not that the re-run stayed finite / received it
    assert nan.title == "NaN/Inf: first at step 1; not re-run to find the origin", nan.title
    text = "\n".join(nan.evidence)
    assert "not re-run (no root model seen yet" in text and "received" not in text, text


def test_a_stuck_verdict_whose_ranks_kept_stepping_is_a_busy_node():
    from probe_cli.diagnose.time_checks import kept_stepping

    # GIVEN "STUCK: ranks 0,1 do not run Python" (their collectives read timed out), as doctor
    # printed on every real script on a node with a load of 25 on 2 cores
    stuck = HangVerdict(True, "STUCK: ranks 0,1 do not run Python; rank 0 is in forward",
                        ["..."], [0, 1], confidence="low", gil_suspects=(0, 1))
    # WHEN a later read from outside finds both heartbeat steps moved on
    moved = kept_stepping(stuck, {0: 154, 1: 154}, {0: 157, 1: 156})
    # THEN no hang, with the steps as evidence
    assert moved is not None and not moved.problem
    assert moved.headline.startswith("no hang: ranks 0,1 kept stepping"), moved.headline
    assert "rank 0: step 154 -> 157" in moved.details[0]
    # AND a rank that did not move keeps the verdict (a GIL really held: no step), as does a
    # step that cannot be read, and a verdict that also blames a rank for something else
    assert kept_stepping(stuck, {0: 154, 1: 154}, {0: 157, 1: 154}) is None
    assert kept_stepping(stuck, {0: 154, 1: None}, {0: 157, 1: 156}) is None
    mixed = HangVerdict(True, "HANG: rank 2 never joined", [], [0, 2], gil_suspects=(0,))
    assert kept_stepping(mixed, {0: 1}, {0: 5}) is None
