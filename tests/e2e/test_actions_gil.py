"""A step-boundary action sent while the rank's GIL is held (tests/programs/gil_holder.py
--train): the watchdog answers 504 at once, but the request sits in the agent's socket and is
served once the GIL comes back. It used to print "probe: nothing ran" and then take effect, so
an operator who retried halved the LR twice. Now the CLI re-sends the same action id (the
agents' idempotency key) and says what it knows."""

from __future__ import annotations

import gc  # noqa: F401 - named in the eval below
import json
from typing import Any

import httpx
import pytest

from probe_cli.main import main
from tests.support import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

LRS = ("import gc, torch\n"
       "[g['lr'] for o in gc.get_objects() if isinstance(o, torch.optim.Optimizer) "
       "for g in o.param_groups]")


def test_an_lr_change_or_an_eval_sent_during_a_gil_hold_runs_once(gil_rank, capsys):
    # GIVEN a training rank, behind its watchdog, that takes optimizer steps
    info, go, done = gil_rank(spin_s=6.0, train=True)  # long enough to be seen held
    url = info["url"]
    with httpx.Client(base_url=url, timeout=10) as client:
        step = wait_until(lambda: (client.get("/v1/step").json().get("step") or 0) > 2 and
                          client.get("/v1/step").json()["step"], 60, "the rank did not step")
        # WHEN its main thread holds the GIL in a C call (the watchdog then answers 504)
        go.touch()
        wait_until(lambda: client.get("/v1/info").json().get("status") == 504, 20,
                   "the watchdog never said the GIL was held")
        code = main(["-t", url.removeprefix("http://"), "lr", "--scale", "0.5",
                     "--at-step", str(step + 300), "--wait", "60"])
        out, err = capsys.readouterr()
        # THEN the CLI never claims nothing ran: it ran (its retry got through), or it says
        # the action is queued, with its id and how to cancel it
        assert "nothing ran" not in err, err
        if code != 0:
            assert "probe: queued as " in err and "`probe actions cancel " in err, err
        # AND once the GIL is back the LR was halved exactly once, by exactly one action
        def lr_actions() -> list[dict] | None:
            r = client.get("/v1/actions")
            if r.status_code != 200:  # the GIL is still held: the watchdog's 504
                return None
            acts = [a for a in r.json()["actions"] if a["kind"] == "lr"]
            return acts if acts and all(a["state"] == "ok" for a in acts) else None

        acts = wait_until(lr_actions, 60, "the lr action never ran")
        assert len(acts) == 1, json.dumps(acts, indent=1)
        lrs = client.post("/v1/eval", json={"code": LRS}).json()
        assert lrs["ok"] and lrs["result"] == "[0.05]", (lrs, out, err)
    _an_eval_sent_during_a_gil_hold_is_named_by_its_504_and_runs_once(info, go, done, capsys)


COUNT = ("import builtins\n"
         "builtins.probe_test_runs = getattr(builtins, 'probe_test_runs', 0) + 1\n"
         "builtins.probe_test_runs")


def _an_eval_sent_during_a_gil_hold_is_named_by_its_504_and_runs_once(
        info: dict, go: Any, done: Any, capsys: Any) -> None:
    """Before, the watchdog's 504 did not say the eval would still run, and a retry (a new
    request) ran it a second time once the GIL came back. (On the lr test's rank: one rank
    for both, suite time.)"""
    url = info["url"]
    returns = len(done.read_text().splitlines()) if done.exists() else 0
    with httpx.Client(base_url=url, timeout=10) as client:
        # WHEN the rank's main thread holds the GIL and an eval arrives
        go.touch()
        wait_until(lambda: client.get("/v1/info").json().get("status") == 504, 20,
                   "the watchdog never said the GIL was held")
        raw = client.post("/v1/eval", json={"code": COUNT, "id": "held1"})
        # THEN its 504 says it will still run, under which id, and how to cancel it
        assert raw.status_code == 504, raw.text
        assert raw.json()["eval_id"] == "held1"
        assert "will still run" in raw.json()["error"], raw.text
        assert "`probe eval --cancel held1`" in raw.json()["error"], raw.text
        # AND the CLI, sending its own eval while the GIL is held, asks again under the same
        # id until it gets the answer (or says what it knows)
        code = main(["-t", url.removeprefix("http://"), "--timeout", "10", "eval", COUNT])
        out, err = capsys.readouterr()
        if code != 0:
            assert "will still run" in err and "--cancel" in err, err
        wait_until(lambda: done.exists() and len(done.read_text().splitlines()) > returns, 30,
                   "the C call never returned")

        # AND once the GIL is back, each id ran exactly once: the same request again is
        # answered from the eval that ran, not run a second time
        def runs() -> int | None:
            r = client.post("/v1/eval", json={"code": "import builtins\n"
                                              "builtins.probe_test_runs"})
            return r.json()["result"] if r.status_code == 200 else None

        assert wait_until(lambda: runs() == "2" and "2", 30, f"runs: {runs()}")
        again = client.post("/v1/eval", json={"code": COUNT, "id": "held1"})
        assert again.status_code == 200 and again.json()["result"] in ("1", "2"), again.text
        assert runs() == "2"
        audit = client.post("/v1/query", json={
            "sql": "SELECT count(*) FROM python.audit WHERE outcome = 'replayed'"}).json()
        assert audit["rows"][0][0] >= 1
