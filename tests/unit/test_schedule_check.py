"""The LR schedule beside GB_tok (probe_cli/diagnose/schedule.py): steps turned into tokens, and
the trap named when the framework's total is not where the schedule ends."""

from __future__ import annotations

from probe_cli.diagnose.schedule import schedules


def row(**kw: object) -> dict:
    base = {"step": 1, "scheduler": "LambdaLR(lr_lambda)", "location": "trainer.lr_scheduler",
            "kind": "warmup+decay", "method": "read", "warmup_steps": 10, "end_step": 40,
            "after_end": "constant", "sched_steps": 0, "total_steps": None,
            "total_source": None, "framework": "lightning", "note": None}
    return {**base, **kw}


def test_a_declared_total_past_the_schedule_end_is_the_trap():
    # GIVEN a schedule ending at step 40 in a job whose Trainer.max_steps is 100, GB_tok 512
    [b] = schedules([row(total_steps=100, total_source="Trainer.max_steps")], 512, 5)
    # THEN the tokens are steps x GB_tok, and the 60 steps past the end are named
    assert (b["warmup_tokens"], b["end_tokens"], b["decay_tokens"], b["total_tokens"]) == (
        5120, 20480, 15360, 51200)
    assert b["check"].startswith("the schedule ends at step 40 but the job runs to step 100 "
                                 "(Trainer.max_steps): its last 60 steps (30,720 tokens) run "
                                 "at the schedule's final LR")


def test_a_total_short_of_the_end_and_a_matching_one():
    [b] = schedules([row(total_steps=20, total_source="Trainer.max_steps")], 512, 5)
    assert "stops 50% of the way" in b["check"]
    [b] = schedules([row(total_steps=40, total_source="Trainer.max_steps")], 512, 39)
    assert b["check"] is None


def test_a_per_epoch_scheduler_gets_no_tokens():
    # GIVEN a scheduler that had stepped 3 times when the agent read it at optimizer step 1000
    [b] = schedules([row(step=1000, sched_steps=3)], 512, 1000)
    assert b["per_optimizer_step"] is False and b["end_tokens"] is None
    assert "not optimizer steps" in b["check"]


def test_doctor_names_the_trap_as_info_with_the_schedule_in_tokens():
    from probe_cli.diagnose.findings import RankDoc, Report
    from probe_cli.diagnose.schedule import check_schedule

    # GIVEN two ranks of 256 tokens a step (GB_tok 512) whose schedule ends at 40 of 100 steps
    tput = {"tokens": 256, "last_step": 30, "steps": 20}
    sched = [row(total_steps=100, total_source="Trainer.max_steps")]
    docs = [RankDoc(r, throughput=[{**tput, "rank": r}], schedule=sched) for r in (0, 1)]
    report = Report()
    check_schedule(report, docs)
    # THEN one info finding says it, with the end in tokens and the next command
    [f] = report.findings
    assert f.severity == "info" and f.check == "schedule"
    assert f.title == ("LR SCHEDULE: the schedule ends at step 40 but the job runs to step 100 "
                       "(Trainer.max_steps): its last 60 steps (30,720 tokens) run at the "
                       "schedule's final LR")
    assert "decay ends at step 40 = 20,480 tokens" in f.evidence[0]
    assert f.next.startswith("probe throughput")
    # AND a schedule that ends with the job is fine
    report = Report()
    check_schedule(report, [RankDoc(0, throughput=[tput], schedule=[row(
        total_steps=40, total_source="Trainer.max_steps")])])
    assert not report.findings and report.fine[0].startswith("LR schedule: LambdaLR")


def test_a_loop_that_sets_the_lr_itself_shows_the_warmup_it_was_seen_to_do():
    # GIVEN no scheduler (nanoGPT's get_lr writes param_groups itself), and the LR recorded
    # from step 1: up to 6e-4 at step 10, down to 4.5e-4 at step 1079
    from probe_cli.diagnose.schedule import schedules
    from probe_cli.render.throughput import schedule_lines

    row = {"step": 1, "scheduler": None, "kind": "none", "note": "no LR scheduler steps these "
           "optimizers", "lr_first": 6e-5, "lr_first_step": 1, "lr_peak": 6e-4,
           "lr_peak_step": 10, "lr_last": 4.47e-4, "lr_last_step": 1079}
    [b] = schedules([row], 2048, 1079)
    # THEN the warmup seen is 10 steps = 10 x GB_tok tokens, and the LR is falling since
    assert b["observed"]["warmup_steps"] == 10 and b["observed"]["warmup_tokens"] == 20480
    assert b["observed"]["since_peak"] == 1069
    [line] = schedule_lines([b])
    assert "rose to 0.0006 by step 10" in line and "(falling)" in line, line
    # AND with the first steps gone (retention), no warmup is claimed
    [b] = schedules([{**row, "lr_first_step": 400, "lr_first": 5.9e-4, "lr_peak": 5.9e-4,
                      "lr_peak_step": 400}], 2048, 1079)
    assert b["observed"]["warmup_steps"] is None
