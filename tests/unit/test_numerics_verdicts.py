"""The numerics verdicts (probe_cli/diagnose/numerics.py) on known series: each fault named with
its cause and next step, healthy jitter and a mild clip quiet, and doctor never suggesting an
LR cut where the LR is not the cause (issues 40 and 45)."""

from __future__ import annotations

import math
import random

from probe_cli.diagnose.doctor import diagnose
from probe_cli.diagnose.hang import HangVerdict
from tests.unit.test_doctor_checks import checks, doc

NO_HANG = HangVerdict(False, "no hang")


def series(n: int = 200, start: float = 2.3, end: float = 1.0, jitter: float = 0.08,
           norm: float = 0.5, clip: float | None = None, ratio: float | None = 1e-3,
           lr: float = 1e-3, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(1, n + 1):
        loss = start + (end - start) * min(1.0, i / (0.6 * n))
        rows.append({"step": i, "loss": loss * (1 + rng.uniform(-jitter, jitter)),
                     "grad_norm": norm * (1 + rng.uniform(-0.1, 0.1)), "clip_max_norm": clip,
                     "nonfinite": False, "lr": lr,
                     "update_ratio": ratio if i % 5 == 0 else None,
                     "max_ratio": 2 * ratio if i % 5 == 0 and ratio is not None else None})
    return rows


def with_numerics(rank: int, rows: list[dict], classes: int | None = 10, events=(),
                  thresholds: dict | None = None, schedule=None):
    d = doc(rank)
    d.file("numerics", rows)
    d.file("numeric_events", list(events))
    d.schedule = schedule or []
    d.state["numerics"] = {"classes": classes, "thresholds": thresholds or {}}
    return d


def report_of(*docs):
    return diagnose(NO_HANG, list(docs), 5.0)


def no_lr_cut(report) -> bool:
    return all("--scale 0." not in (f.next or "") for f in report.findings)


def test_healthy_jitter_and_a_mild_clip_stay_quiet():
    # GIVEN a falling loss with +-8% jitter, clipped on ~every step at median norm 1.09 vs
    # max_norm 1.0 (issue 45's HF Trainer)
    rows = series(norm=1.09, clip=1.0)
    report = report_of(with_numerics(0, rows), with_numerics(1, series(seed=1)))
    # THEN nothing above info, the clip is information with its small cost, no LR advice
    assert not report.problem, [f.title for f in report.findings]
    clip = next(f for f in report.findings if f.check == "clipping")
    assert clip.severity == "info" and "updates shrink by ~8%" in clip.title
    assert "not a problem" in clip.title and no_lr_cut(report)


def test_a_spike_names_step_rank_factor_modules_and_batch():
    rows = series()
    rows[119]["loss"] = 3.2 * rows[118]["loss"]
    events = [{"step": 120, "module": "(total)", "kind": "anomaly",
               "samples": "batch 0: [17, 3, 99]"},
              {"step": 120, "module": "layers.3", "kind": "anomaly", "grad_norm": 12.0,
               "baseline": 0.5},
              {"step": 120, "module": "layers.0", "kind": "anomaly", "grad_norm": 0.6,
               "baseline": 0.5}]
    report = report_of(with_numerics(0, series(seed=2)), with_numerics(1, rows, events=events))
    spike = next(f for f in report.findings if f.check == "spike")
    assert spike.severity == "warning" and spike.ranks == [1]
    assert spike.title.startswith("LOSS SPIKE: rank 1 step 120: loss x")
    assert spike.detail["factor"] > 2.4 and spike.detail["step"] == 120
    assert any("layers.3 x24.0" in e for e in spike.evidence), spike.evidence
    assert any("[17, 3, 99]" in e for e in spike.evidence)
    assert any("went back" in e for e in spike.evidence)


def test_max_norm_far_below_the_norm_is_raise_max_norm_never_an_lr_cut():
    report = report_of(with_numerics(0, series(norm=0.3, clip=0.01)))
    clip = next(f for f in report.findings if f.check == "clipping")
    assert clip.severity == "warning" and clip.detail["cause"] == "max_norm"
    assert "raise max_norm" in clip.next and no_lr_cut(report)


def test_clipping_with_growing_norms_and_a_flat_loss_is_the_lr():
    rows = series(start=2.0, end=2.0, clip=1.0)
    for i, r in enumerate(rows):
        r["grad_norm"] = 1.0 + 4.0 * i / len(rows)
    clip = next(f for f in report_of(with_numerics(0, rows)).findings if f.check == "clipping")
    assert clip.detail["cause"] == "lr" and clip.next == "probe lr --scale 0.1"


def test_a_schedule_that_ended_is_lr_zero_not_too_high():
    rows = series(lr=1e-3)
    for r in rows[120:]:
        r["lr"] = 0.0
    report = report_of(with_numerics(0, rows, schedule=[{"end_step": 120}]))
    zero = next(f for f in report.findings if f.check == "lr_zero")
    assert "since step 121" in zero.title and "schedule ended at its step 120" in zero.title
    assert "too high" not in " ".join(f.title for f in report.findings if f.check != "lr_zero")
    assert no_lr_cut(report)


def test_a_flat_loss_with_tiny_updates_is_stalled():
    report = report_of(with_numerics(0, series(start=2.0, end=1.99, ratio=1e-6)))
    stall = next(f for f in report.findings if f.check == "stalled")
    assert stall.next == "probe lr --scale 10" and "far too low" in stall.title


def test_a_loop_that_sets_its_own_lr_is_not_sent_to_probe_lr():
    """build-nanogpt's get_lr sets the LR every step: doctor said `probe lr --scale 10` for its
    stall and "the loop overwrites an LR changed from outside" in its LR block."""
    rows = series(start=6.95, end=6.94, ratio=1e-6)
    for r in rows:
        r["lr"] = 6e-8 * (1 - r["step"] * 1e-6)  # a cosine barely past its peak
    d = with_numerics(0, rows)
    d.state["schedulers"] = []
    stall = next(f for f in report_of(d).findings if f.check == "stalled")
    assert stall.next.startswith("raise the peak LR the training script computes each step "
                                 "(x10)"), stall.next


def test_a_mild_clip_whose_norms_were_not_read_gets_no_lr_how_to():
    """num_clip_mild under load: the per-step norms did not answer, so clipping.py could not
    judge the clip, and the LR block's how-to "probe lr --scale 0.5" read as advice."""
    d = doc(0, loop={"clip_steps": 50, "clipped_steps": 50, "clip_max_norm": 0.8,
                     "clip_finite_steps": 50, "grad_norm_median": 1.02})
    report = report_of(d)
    assert no_lr_cut(report), [(f.check, f.next) for f in report.findings]
    # a job that does not clip still gets the how-to
    assert any("--scale 0.5" in (f.next or "") for f in report_of(doc(0)).findings)


def test_a_loss_at_chance_level_is_not_learning():
    rows = series(start=math.log(10), end=math.log(10), jitter=0.02)
    report = report_of(with_numerics(0, rows, classes=10))
    f = next(f for f in report.findings if f.check == "not_learning")
    assert "chance level" in f.title and "ln of 10 classes" in f.title
    assert no_lr_cut(report)  # the update ratios are normal: the LR is not blamed


def test_a_rising_loss_with_huge_updates_is_diverging_from_the_lr():
    rows = series(start=2.3, end=1.0, ratio=0.5)
    for i, r in enumerate(rows[100:]):
        r["loss"] = 1.2 + 0.02 * i
    report = report_of(with_numerics(0, rows))
    assert checks(report)["diverging"] == "critical"
    assert checks(report)["lr_high"] == "warning"
    assert next(f for f in report.findings if f.check == "diverging").next == \
        "probe lr --scale 0.1"


def test_thresholds_come_from_the_ranks():
    rows = series()
    rows[119]["loss"] = 3.2 * rows[118]["loss"]
    quiet = report_of(with_numerics(0, rows, thresholds={"spike_factor": 5.0}))
    assert "spike" not in checks(quiet)


def test_clipping_with_a_rising_loss_is_the_lr_on_every_rank_alike():
    # GIVEN lr_high's DDP ranks: every step clipped at ~100x max_norm and the loss rising;
    # their windows differ (one saw the norms grow x2.2, the other x1.5)
    def ranked(rank: int, growth: float) -> object:
        rows = series(start=14.0, end=14.0, clip=1.0, ratio=None, seed=rank)
        for i, r in enumerate(rows):
            r["grad_norm"] = 74.0 * (1 + (growth - 1) * i / len(rows))
            r["loss"] = 14.0 + 0.5 * i
        return with_numerics(rank, rows)

    report = report_of(ranked(0, 2.2), ranked(1, 1.5))
    clips = [f for f in report.findings if f.check == "clipping"]
    # THEN one finding, the LR, over both ranks; never "raise max_norm"
    assert len(clips) == 1 and clips[0].ranks == [0, 1] and clips[0].detail["cause"] == "lr"
    assert "raise max_norm" not in clips[0].next and "LR is not" not in clips[0].title


def test_a_noisy_flat_loss_is_not_diverging():
    rows = series(start=8.0, end=8.0, jitter=0.35, ratio=None, seed=3)
    assert "diverging" not in checks(report_of(with_numerics(0, rows, classes=None)))


def test_a_dead_net_at_chance_with_one_module_moving_fast_is_the_lr():
    # GIVEN num_lr_high's job: the loss blew up, then sits at chance (dead ReLUs: their update
    # ratio is weight decay's lr x wd), while the last layer moves 14% of its norm per step
    rows = series(start=math.log(10), end=math.log(10), jitter=0.02, ratio=0.003)
    for r in rows[:10]:
        r["loss"] = 4.7
    for r in rows:
        if r["update_ratio"] is not None:
            r["max_ratio"] = 0.136
    report = report_of(with_numerics(0, rows, classes=10))
    assert checks(report)["not_learning"] == "warning" and checks(report)["lr_high"] == "warning"
    assert next(f for f in report.findings if f.check == "not_learning").next == \
        "probe lr --scale 0.1"


def test_norms_that_grow_while_the_loss_falls_are_not_the_lr():
    # GIVEN num_clip_small: max_norm 0.001, norms 0.45 -> 1.0 as a healthy loss falls
    rows = series(clip=0.001, norm=0.7)
    for i, r in enumerate(rows):
        r["grad_norm"] = 0.45 + 0.55 * i / len(rows)
    clip = next(f for f in report_of(with_numerics(0, rows)).findings if f.check == "clipping")
    assert clip.detail["cause"] == "max_norm" and "raise max_norm" in clip.next


def test_an_early_blow_up_then_a_dead_net_at_chance_is_the_lr():
    # GIVEN num_lr_high as measured (AdamW lr 0.3, wd 0.01): the loss 2.27 -> 23.7 -> 28 in
    # the first steps, the median module moving 0.21 of its norm at step 5; then the units
    # are dead: the loss sits at chance, the median ratio pinned at lr x wd = 0.003 and the
    # module that moves most at 0.007 (under high_ratio: the last-half ratios look normal)
    rows = series(n=300, start=math.log(10), end=math.log(10), jitter=0.03, ratio=0.003,
                  lr=0.3)
    for r, loss in zip(rows, (2.27, 23.7, 27.96, 26.5, 15.8, 4.36, 4.98, 3.64, 2.72, 2.33)):
        r["loss"] = loss
    for r, ratio in zip(rows[4::5], (0.205, 0.077, 0.042, 0.025, 0.017, 0.012, 0.011)):
        r["update_ratio"], r["max_ratio"] = ratio, 1.6 * ratio
    for r in rows[40::5]:
        r["max_ratio"] = 0.007
    d = with_numerics(0, rows, classes=10)
    d.state["optimizers"] = [{"class": "AdamW", "groups": [{"lr": 0.3, "weight_decay": 0.01}]}]
    report = report_of(d)
    # THEN not "check the labels": the LR, with the blow-up's step and size as evidence, and
    # a restart (a lower LR now does not revive dead units)
    found = checks(report)
    assert found["not_learning"] == "warning" and found["lr_high"] == "warning", found
    high = next(f for f in report.findings if f.check == "lr_high")
    assert "at step 5" in high.title and "x12.3" in high.title, high.title
    assert high.next.startswith("restart from before the blow-up with a 10x lower LR")
    nl = next(f for f in report.findings if f.check == "not_learning")
    assert "labels" not in nl.next and "lower LR" in nl.next
    assert any("only weight decay moves the weights" in e for e in nl.evidence), nl.evidence


def test_a_healthy_start_with_big_first_updates_is_not_a_blow_up():
    # GIVEN a healthy run whose first traced steps move the median module by 0.15 (Adam's
    # first steps, no warmup) while the loss falls from the start
    rows = series(ratio=1e-3)
    for r in rows[4:20:5]:
        r["update_ratio"] = 0.15
    report = report_of(with_numerics(0, rows, classes=10))
    assert "lr_high" not in checks(report) and not report.problem


def test_a_spike_whose_anomaly_rows_were_not_read_claims_no_missing_dataloader():
    # GIVEN a spike whose rank did not answer the anomaly-rows query (a timeout under load)
    rows = series()
    rows[119]["loss"] = 3.2 * rows[118]["loss"]
    d = with_numerics(0, rows)
    d.file("numeric_events", None)
    d.errors["numeric_events"] = "timed out after 5 s"
    spike = next(f for f in report_of(d).findings if f.check == "spike")
    # THEN it says the rows were not read and why, never "the loop does not iterate a
    # DataLoader" (it may well)
    text = " ".join(spike.evidence)
    assert "does not iterate a DataLoader" not in text
    assert "anomaly rows were not read (timed out after 5 s)" in text, text


def test_lr_zero_whose_start_fell_in_the_unread_gap_says_so():
    # GIVEN num_sched_end's rows as the query reads them: steps 1-20 and the last ones (101-
    # 300); the cosine reached 0 after step 40, in the gap; one row has no LR read
    rows = [r for r in series(n=300, lr=1e-3) if r["step"] <= 20 or r["step"] > 100]
    for r in rows:
        if r["step"] > 40:
            r["lr"] = 0.0
    rows[-5]["lr"] = None
    report = report_of(with_numerics(0, rows))
    zero = next(f for f in report.findings if f.check == "lr_zero")
    # THEN not "since step 21": somewhere between 21 and 101
    assert "since a step between 21 and 101 (steps in between not read)" in zero.title, \
        zero.title
