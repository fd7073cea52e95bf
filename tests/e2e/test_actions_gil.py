"""A step-boundary action sent while the rank's GIL is held (tests/programs/gil_holder.py
--train): the watchdog answers 504 at once, but the request sits in the agent's socket and is
served once the GIL comes back. It used to print "probe: nothing ran" and then take effect, so
an operator who retried halved the LR twice. Now the CLI re-sends the same action id (the
agents' idempotency key) and says what it knows."""

from __future__ import annotations

import gc  # noqa: F401 - named in the eval below
import json

import httpx
import pytest

from probe_cli.main import main
from tests.support import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

LRS = ("import gc, torch\n"
       "[g['lr'] for o in gc.get_objects() if isinstance(o, torch.optim.Optimizer) "
       "for g in o.param_groups]")


def test_an_lr_change_sent_during_a_gil_hold_is_applied_once(gil_rank, capsys):
    # GIVEN a training rank, behind its watchdog, that takes optimizer steps
    info, go, _ = gil_rank(spin_s=3.0, train=True)
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
            acts = [a for a in client.get("/v1/actions").json()["actions"] if a["kind"] == "lr"]
            return acts if acts and all(a["state"] == "ok" for a in acts) else None

        acts = wait_until(lr_actions, 60, "the lr action never ran")
        assert len(acts) == 1, json.dumps(acts, indent=1)
        lrs = client.post("/v1/eval", json={"code": LRS}).json()
        assert lrs["ok"] and lrs["result"] == "[0.05]", (lrs, out, err)
