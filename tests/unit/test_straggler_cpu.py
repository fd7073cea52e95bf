"""The straggler verdict's CPU-wait rule (diagnose/cpu_wait.py) on hand-built per-rank rows:
ranks that share a machine's cores with no pinning are not blamed for the scheduler's pick; a
rank pinned to its own busy cores, and a rank that computes or sleeps more, still are."""

from __future__ import annotations

from probe_cli.diagnose.cpu_wait import RankCpu, cpu_contention
from probe_cli.diagnose.findings import RankDoc, Report
from probe_cli.diagnose.straggler import diagnose_stragglers
from probe_cli.diagnose.time_checks import check_straggler
from probe_protocol.cpulist import cpu_list, parse_cpu_list

BOOT = "0f7c2d8e-5b1a-4f7e-9c3d-2a6b8e1f4c90"


def lockstep(slow: int, lag: float, n_ranks: int = 2, steps: int = 50,
             period: float = 0.06) -> dict[int, list[dict]]:
    """Two collectives per step; ``slow`` enters the first of each step ``lag`` s late."""
    rows: dict[int, list[dict]] = {r: [] for r in range(n_ranks)}
    for s in range(steps):
        for k in range(2):
            for r in range(n_ranks):
                late = lag if (r == slow and k == 0) else 0.0
                rows[r].append({"pg": "0", "seq": 2 * s + k + 1, "is_p2p": False,
                                "start_time": s * period + k * 0.001 + late,
                                "group_ranks": list(range(n_ranks))})
    return rows


def row(wait: float, run: float, cpus: str = "0-1", boot: str = BOOT,
        load: float = 7.2) -> dict:
    """A rank's ``cpu_window`` row (sql/queries/cpu_window.sql)."""
    return {"cpu_wait_share": wait, "cpu_run_share": run, "boot_id": boot,
            "cpu_affinity": cpus, "load_1m": load}


def cpu(**rows_by_rank: dict) -> dict[int, RankCpu | float]:
    return {int(k[1:]): c for k, r in rows_by_rank.items() if (c := RankCpu.from_row(r))}


def test_ranks_sharing_unpinned_cores_are_not_blamed_for_the_schedulers_pick():
    # GIVEN a healthy job at load 7 on 2 cores (num_clip_small, measured): rank 1 last at every
    # step, waiting for a CPU 43% of its step time against rank 0's 12%, both on a CPU 8%, both
    # free to run on CPUs 0-1 of one machine
    rows = lockstep(slow=1, lag=0.01)
    assert diagnose_stragglers(rows).problem  # without the CPU rows: named
    v = diagnose_stragglers(rows, cpu_wait=cpu(r0=row(0.12, 0.08), r1=row(0.43, 0.08)))
    # THEN no rank is named (exit 0): the machine is oversubscribed, on the shared cores
    assert not v.problem and v.culprits == [] and v.contention, v.headline
    assert v.headline == (
        "no straggler: rank 1 waited for a CPU 43% of its step time (the others a median 12%), "
        "but ranks 0,1 share CPUs 0-1 of one machine at load 7.2 with no pinning: which of them "
        "waits is the scheduler's pick, not the rank's doing; the machine is oversubscribed")
    js = v.to_json()
    assert js["cpu_contention"] is True and js["shared_cpus"] == "0-1"
    assert js["ranks"][1] | {"others_waited_s": 0} == {
        "rank": 1, "arrived_last": 50, "others_waited_s": 0, "median_lag_ms": 10.0,
        "cpu_wait_share": 0.43, "cpu_run_share": 0.08, "cpus": "0-1", "load_1m": 7.2}


def test_overlapping_affinity_is_enough_to_share_cores():
    c = cpu(r0=row(0.12, 0.08, cpus="0-2"), r1=row(0.43, 0.08, cpus="2-3"))
    found = cpu_contention(1, 0.16, c)  # type: ignore[arg-type]
    assert found is not None and found.kind == "shared" and found.cpus == "2"


def test_a_rank_pinned_to_its_own_busy_cores_is_still_named():
    # GIVEN the same waits, but each rank pinned to a CPU of its own (rank 1's is contended by
    # something else)
    rows = lockstep(slow=1, lag=0.01)
    v = diagnose_stragglers(rows, cpu_wait=cpu(r0=row(0.12, 0.08, cpus="0"),
                                                r1=row(0.43, 0.08, cpus="1")))
    # THEN rank 1 is named, with its busy cores as the cause
    assert v.problem and v.culprits == [1] and not v.contention, v.headline
    assert "waited for a CPU 43% of its step time: another process or too many threads on its " \
           "cores" in v.headline


def test_a_rank_on_another_machine_is_still_named():
    rows = lockstep(slow=1, lag=0.01)
    v = diagnose_stragglers(rows, cpu_wait=cpu(r0=row(0.12, 0.08),
                                                r1=row(0.43, 0.08, boot="other-kernel")))
    assert v.problem and v.culprits == [1], v.headline
    # AND without a record of where the ranks ran, as before this rule: named
    v = diagnose_stragglers(rows, cpu_wait={0: 0.12, 1: 0.43})
    assert v.problem and v.culprits == [1], v.headline


def test_a_rank_that_computes_more_on_shared_cores_is_named():
    # GIVEN rank 1 does twice the work of rank 0 on the shared cores at load 7: it runs twice
    # as long and waits twice as long (the scheduler's wait per CPU second is the same, 3x)
    rows = lockstep(slow=1, lag=0.02)
    v = diagnose_stragglers(rows, cpu_wait=cpu(r0=row(0.27, 0.09), r1=row(0.54, 0.18)))
    # THEN it is a straggler, and the verdict says it computes more
    assert v.problem and v.culprits == [1], (v.headline, v.details)
    assert "it ran on a CPU 18% of its step time, more than the others: it computes more" \
        in v.headline


def test_a_rank_that_sleeps_on_shared_cores_is_named():
    # the fault suite's slow rank: 50 ms of sleep a step, on cores that keep both ranks waiting
    rows = lockstep(slow=1, lag=0.05)
    v = diagnose_stragglers(rows, cpu_wait=cpu(r0=row(0.3, 0.08), r1=row(0.2, 0.05)))
    assert v.problem and v.culprits == [1], v.headline
    assert any("more than that explains" in d for d in v.details)


def test_doctor_reports_shared_cores_as_information_with_the_cores_to_split():
    # GIVEN doctor's rows: rank 1 late by 15 ms of 60 at every step (past doctor's 20% bar),
    # the waits of ranks sharing CPUs 0-1
    rows = lockstep(slow=1, lag=0.015)
    docs = [RankDoc(r, loop=[{"step_ms": 60.0, "cpu_wait_share": w}],
                    collectives=tuple(rows[r]), answers={"cpu": [row(w, 0.08)]})
            for r, w in ((0, 0.12), (1, 0.43))]
    report = Report()
    check_straggler(report, docs)
    # THEN an information finding, no warning, naming the cores
    [f] = report.findings
    assert f.severity == "info" and f.check == "cpu_contention" and f.ranks == [], f
    assert f.title.startswith("CPU CONTENTION: rank 1 waited for a CPU 43%"), f.title
    assert "taskset -c" in f.next and "0-1" in f.next


def test_cpu_lists_round_trip_and_bad_ones_are_unknown():
    assert cpu_list({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"
    assert parse_cpu_list("0-3,8,10-11") == frozenset({0, 1, 2, 3, 8, 10, 11})
    assert parse_cpu_list("") is None and parse_cpu_list(None) is None
    assert parse_cpu_list("3-1") is None and parse_cpu_list("x") is None


def test_the_cpu_shares_of_the_arrivals_window_win_over_the_last_steps():
    # GIVEN each rank's answer to `probe straggler`: its collectives, its straggler_steps row
    # over the last 50 steps (rank 1 waited 11%: the older steps of the window, when it waited
    # 42%, are not in it) and its cpu_window row over the window the collectives span
    from probe_cli.gather.evidence import straggler_verdict
    from probe_cli.result import RankResult
    from probe_protocol.bodies import CollectivesBody
    from probe_protocol.query import QueryBody

    rows = lockstep(slow=1, lag=0.01)

    def answer(rank: int, last_steps_wait: float, window: dict) -> RankResult:
        steps = QueryBody(rank, ("step_ms", "cpu_wait_share"), ("DOUBLE", "DOUBLE"),
                          ([60.0, last_steps_wait],)).to_wire()
        coll = CollectivesBody(rank, collectives=tuple(rows[rank]), now=10.0).to_wire()
        return RankResult(rank, f"http://r{rank}", True, {"ok": True, "rank": rank,
                          "collectives": coll, "steps": steps, "work": None, "cpu": window})

    results = [answer(0, 0.14, row(0.12, 0.08)), answer(1, 0.11, row(0.43, 0.08))]
    v, _ = straggler_verdict(results, 200, 0.1)
    # THEN the window's shares decide: shared cores, no straggler
    assert not v.problem and v.shared_cpus == "0-1", v.headline
    # AND from an agent without the cpu_window query, the last steps' share (as before)
    for r in results:
        assert r.data is not None
        r.data["cpu"] = None
    v, _ = straggler_verdict(results, 200, 0.1)
    assert v.problem and v.culprits == [1], v.headline
