"""The fault suite's throughput-lever scenarios (tests/programs/lever_job.py), imported by
bench/verdicts.py: host syncs in the loop, many small ops not compiled, host work inside one
module, an imbalanced MoE (also expert-parallel, over all-to-all), uneven batches between ranks,
and healthy runs that must stay quiet (no lever, no host-sync or MoE finding).

Each scenario is scored as verdicts.py scores every other: the verdict kinds each command must
name (and nothing else), plus ``lever`` (the LOW THROUGHPUT finding's lever, "none" = no such
finding), ``quiet`` (doctor checks that may not appear at all, not even as information) and
``says`` (text a command's answer must hold: the straggler's why, the MoE layer and expert).
The healthy runs' lever is not scored ("host" is the largest share on 2 busy cores: DDP's wait
at the end of backward); none of this issue's levers or findings may appear there.
"""

from __future__ import annotations

from typing import Any


def lever_scenarios(scenario: Any) -> list[Any]:
    """The scenarios, built with verdicts.py's ``Scenario`` (passed in: no import cycle)."""
    none = {"hang": frozenset(), "straggler": frozenset(), "doctor": frozenset()}
    quiet = frozenset({"host_syncs", "moe"})
    #: a healthy loop: none of this issue's verdicts, and no small-ops false alarm (the lever
    #: itself is not scored: on 2 busy cores DDP's wait makes "host" the largest share)
    healthy = quiet | {"small_ops", "module_host", "graph_breaks"}

    def lv(name: str, **kw: Any) -> Any:
        kw.setdefault("expect", none)
        return scenario(name, program="lever_job.py", ready_step=40, step_s=0.0,
                        trace="every:5", **kw)

    return [
        lv("lv_syncs", lever="host_syncs", says=(("doctor", "lever_job.py:"),)),
        # 300 linear layers in a row train badly (loss spikes, or a stall at a low LR): the
        # numerics verdicts about that are tolerated, the lever is what is scored
        lv("lv_small_ops", lever="small_ops", quiet=quiet,
           allow=frozenset({"spike", "stalled", "diverging", "not_learning", "lr_high"}),
           says=(("doctor", "not compiled"),)),
        lv("lv_host_module", lever="module_host", quiet=quiet,
           says=(("doctor", "bottleneck: 1: "),)),
        lv("lv_moe", expect={**none, "doctor": frozenset({"moe"})},
           says=(("doctor", ": expert 0 gets"),)),
        # expert parallelism: rank 0 holds the busy expert, computes most tokens and is the
        # straggler its peer waits for in all-to-all (a right straggler verdict, tolerated)
        lv("lv_moe_ep", expect={**none, "doctor": frozenset({"moe"})},
           allow=frozenset({"straggler"}),
           says=(("doctor", "; rank 0 holds it and computes"),)),
        lv("lv_uneven", expect={"hang": frozenset(), "straggler": frozenset({"straggler"}),
                                "doctor": frozenset({"straggler"})},
           says=(("doctor", "its batch is 3.0x"),)),
        lv("lv_healthy", quiet=healthy, healthy=True),
        lv("lv_moe_even", quiet=healthy, healthy=True),
    ]
