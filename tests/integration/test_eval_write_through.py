"""An eval's assignments to the script's globals (operator_code.py), against a real agent.

``LR = 1e-4`` must reach a script that reads LR every step; ``m = <something else>`` over the
script's model must not (an eval that bound ``m`` to a ctypes struct killed a DDP job at its
next step): the rebinding is dropped, the eval's stderr says so, and the script keeps its m.
"""

from __future__ import annotations

import sys

import pytest


@pytest.fixture
def script_globals():
    main = sys.modules["__main__"]
    names = {"PROBE_T_LR": 6e-4, "PROBE_T_ITERS": 100, "PROBE_T_MODEL": object(),
             "PROBE_T_LATER": None}
    for k, v in names.items():
        setattr(main, k, v)
    yield main
    for k in names:
        delattr(main, k)


def test_same_kind_writes_through_and_another_kind_stays_in_the_session(client, script_globals):
    main = script_globals
    model = main.PROBE_T_MODEL
    # WHEN the operator changes a number, fills a None, and rebinds the model to an int
    body = client.post("/v1/eval", json={"code": (
        "PROBE_T_LR = 1e-4\nPROBE_T_ITERS = 50.0\nPROBE_T_LATER = [1]\nPROBE_T_MODEL = 3"
    )}).json()
    assert body["ok"], body
    # THEN the numbers and the None are the script's now
    assert (main.PROBE_T_LR, main.PROBE_T_ITERS, main.PROBE_T_LATER) == (1e-4, 50.0, [1])
    # AND the model is not replaced; the eval says so in one line
    assert main.PROBE_T_MODEL is model
    assert body["stderr"] == ("probe: 'PROBE_T_MODEL' was not written to the script: it holds "
                              "a object and this eval bound a int; the job keeps its own (use "
                              "another name)\n"), body
    # AND a later eval sees the script's object
    later = client.post("/v1/eval", json={"code": "PROBE_T_MODEL is not None"}).json()
    assert later["ok"] and later["result"] == "True", later


def test_a_lowered_global_is_seen_by_the_script_within_the_same_eval(client, script_globals):
    """Write-through used to land only after the eval ended: a script function called in the
    same code read the old value."""
    # GIVEN a script function that reads the global from __main__
    exec("def probe_t_get_lr():\n    return PROBE_T_LR\n", vars(script_globals))
    try:
        # WHEN one eval lowers the global and reads it back through the script's function
        body = client.post("/v1/eval", json={"code": (
            "PROBE_T_LR = 1e-5\nseen = probe_t_get_lr()\n"
            "doubled = [PROBE_T_LR * 2 for _ in range(1)]\n(seen, doubled)")}).json()
        # THEN the function and a comprehension both see the new value
        assert body["ok"], body
        assert body["result"] == "(1e-05, [2e-05])", body
        assert script_globals.PROBE_T_LR == 1e-5
    finally:
        del script_globals.probe_t_get_lr
