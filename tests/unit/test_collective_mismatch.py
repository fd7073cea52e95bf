"""Collective mismatches classified from every rank's collectives rows (pure): each kind names
both sides with op, sizes and call site, and which side is the odd one out."""

from __future__ import annotations

import json

from probe_cli.diagnose.hang import RankState, diagnose
from probe_cli.diagnose.mismatch import find_mismatch

NOW = 1_000.0
DDP = "/job/train.py:152 main"
LOG = "/job/train.py:75 log_metric"


def row(seq, op="all_reduce", shapes=((577,),), dtype="float32", state="done", site=DDP,
        ranks=(0, 1), started=None, error=None):
    return {"pg": "0", "seq": seq, "op": op, "shapes": json.dumps([list(s) for s in shapes]),
            "dtype": dtype, "state": state, "callsite": site, "group_ranks": list(ranks),
            "start_time": NOW - 60 + seq if started is None else started, "error": error,
            "is_p2p": False}


def history(n=10):
    return tuple(row(s) for s in range(1, n))


def test_rank0_only_collective_aborted_by_gloo_names_rank0_as_odd():
    # GIVEN rank 0's extra scalar all_reduce (its copy: pending when gloo aborted it) and rank
    # 1's DDP gradient all-reduce of 577 floats at the same seq, failed on the reset connection
    r0 = RankState(0, collectives=(*history(), row(10, shapes=((1,),), state="pending",
                                                     site=LOG, started=NOW - 0.01)), now=NOW)
    r1 = RankState(1, collectives=(*history(), row(10, state="failed",
                                                     error="RuntimeError: Connection reset")),
                   now=NOW)
    # WHEN
    v = diagnose([r0, r1])
    # THEN sizes differ; rank 0's call is new, rank 1's ran 9 times before
    assert v.problem and v.culprits == [0]
    assert v.mismatch["kind"] == "sizes" and v.mismatch["odd_ranks"] == [0]
    assert v.headline == (
        "COLLECTIVE MISMATCH (different sizes) at #10 of group 0: rank 0 called all_reduce "
        "with [1] at train.py:75 log_metric where rank 1 called all_reduce with [577] at "
        "train.py:152 main; rank 0 is the odd one out")
    assert any("was made 9 times before" in d for d in v.details), v.details
    assert any(d.startswith("rank 1: all_reduce #10 failed: RuntimeError") for d in v.details)


def test_dtype_and_op_and_group_kinds():
    def pair(a, b):
        return find_mismatch({0: (*history(), a), 1: (*history(), b)})

    m = pair(row(10, shapes=((4,),), state="pending", site=LOG),
             row(10, shapes=((4,),), dtype="float64", state="pending", site=LOG))
    assert m.kind == "dtype" and "all_reduce in float64" in m.headline()
    assert m.odd is None and "cannot tell" in m.why_odd or "tables cannot" in m.why_odd
    m = pair(row(10, state="pending"), row(10, op="broadcast", state="pending", site=LOG))
    assert m.kind == "op" and m.culprits == [1]
    m = pair(row(10, state="pending"), row(10, state="pending", ranks=(1,)))
    assert m.kind == "group" and "group [1]" in m.headline()


def test_order_and_sequence_are_told_from_the_neighbouring_seqs():
    a, b = row(10, shapes=((4,),), site=LOG), row(10, op="broadcast", shapes=((4,),), site=LOG)
    a1 = {**row(11, op="broadcast", shapes=((4,),), site=LOG), "state": "pending"}
    b1 = {**row(11, shapes=((4,),), site=LOG), "state": "pending"}
    m = find_mismatch({0: (*history(), a, a1), 1: (*history(), b, b1)})
    # seq 10 went through (gloo let it), seq 11 is where they wait: each called the other's
    assert m is not None and m.seq == 11 and m.kind in ("order", "op")
    m = find_mismatch({0: (*history(), {**a, "state": "pending"}, ),
                       1: (*history(), {**b, "state": "pending"})})
    assert m.kind == "op"


def test_sizes_of_all_to_all_may_differ_and_healthy_rows_are_quiet():
    uneven = {0: (*history(), row(10, op="all_to_all", shapes=((3,),), state="pending")),
              1: (*history(), row(10, op="all_to_all", shapes=((5,),), state="pending"))}
    assert find_mismatch(uneven) is None
    healthy = {0: (*history(), row(10, state="pending")), 1: (*history(), row(10))}
    assert find_mismatch(healthy) is None


def test_three_ranks_against_one_name_the_one_by_majority():
    rows = {r: (*history(), row(10, state="pending", ranks=(0, 1, 2, 3))) for r in (0, 1, 2)}
    rows[3] = (*history(), row(10, shapes=((5,),), state="pending", site=LOG, ranks=(0, 1, 2, 3)))
    m = find_mismatch(rows)
    assert m.kind == "sizes" and m.culprits == [3] and "against 3 ranks" in m.why_odd


def test_two_ops_from_one_function_say_order_or_branch_without_guessing():
    # GIVEN rank 0 in all_reduce and rank 1 in broadcast at #10, both from sync_both (the
    # fault suite's order scenario at the moment gloo hangs on the first swapped pair)
    r0 = RankState(0, collectives=(*history(), row(10, shapes=((4,),), state="pending",
                                                     site="/job/train.py:87 sync_both")), now=NOW)
    r1 = RankState(1, collectives=(*history(), row(10, op="broadcast", shapes=((4,),),
                                                     state="pending",
                                                     site="/job/train.py:90 sync_both")), now=NOW)
    m = find_mismatch({0: r0.collectives, 1: r1.collectives})
    # THEN the kind stays op (nothing recorded says what either calls next), with both readings
    assert m is not None and m.kind == "op"
    assert ("both calls are in sync_both (train.py:87 and :90): if every rank makes both, they "
            "make them in a different order (an order mismatch); if not, one side took another "
            "branch") in m.details()
    # AND calls from different functions get no such line
    r1 = RankState(1, collectives=(*history(), row(10, op="broadcast", shapes=((4,),),
                                                     state="pending", site=LOG)), now=NOW)
    m = find_mismatch({0: r0.collectives, 1: r1.collectives})
    assert m is not None and not any("both calls are in" in d for d in m.details())
