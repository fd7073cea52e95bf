"""The RSS that answering requests keeps is the agent's, not the job's (serving/footprint.py).

A real agent, real HTTP: an eval that keeps 64 MiB is charged to the agent; one that allocates
64 MiB and frees it is not; a busy period longer than MAX_PERIOD_S (mostly waiting, while the
job allocates beside it) is not charged at all, so a busy client cannot hide a job's leak.
"""

from __future__ import annotations

from probe_agent.serving.footprint import MAX_PERIOD_S

#: Where the evals below keep their bytes (cleared at the end).
KEPT: list[bytes] = []
_HOLDER = f"__import__('sys').modules[{__name__!r}].KEPT"


def test_memory_kept_by_a_request_is_charged_to_the_agent(agent, client):
    fp = agent.footprint
    try:
        # WHEN an eval keeps 64 MiB (the bytes are written: resident)
        start = fp.growth_mib
        assert client.post("/v1/eval", json={"code": f"{_HOLDER}.append(b'x' * (64 << 20))"}
                           ).json()["ok"]
        kept = fp.growth_mib - start
        # THEN the busy period's RSS change is the agent's
        assert 56 <= kept <= 96, kept
        # WHEN an eval allocates 64 MiB and lets it go
        mid = fp.growth_mib
        assert client.post("/v1/eval", json={"code": "len(b'y' * (64 << 20))"}).json()["ok"]
        # THEN nothing more is charged
        assert abs(fp.growth_mib - mid) < 16, fp.growth_mib - mid
        # WHEN a request keeps memory but stays in flight longer than MAX_PERIOD_S
        mid = fp.growth_mib
        code = (f"{_HOLDER}.append(b'z' * (64 << 20))\n"
                f"__import__('time').sleep({MAX_PERIOD_S + 0.5})")
        assert client.post("/v1/eval", json={"code": code}).json()["ok"]
        # THEN it is not charged (the job may have allocated meanwhile)
        assert fp.growth_mib == mid
        assert fp.inflight == 0
    finally:
        KEPT.clear()
