"""Ranks of a node share the measured CPU peak (``cpu_peak.json``): two ranks writing at once
both land (merged under a lock, replaced by a rename), and two ranks asking for the peak at once
run one probe between them: the second waits for the first and reuses its figure."""

from __future__ import annotations

import json
import multiprocessing as mp

from probe_agent.collectors.peak import update_cache

KEYS = 150


def _add_keys(path: str, prefix: str, start) -> None:  # noqa: ANN001 - an mp.Event
    start.wait()
    for i in range(KEYS):
        update_cache(path, lambda cache, i=i: cache.__setitem__(f"{prefix}{i}", float(i)))


def _peak(run_dir: str, start, out) -> None:  # noqa: ANN001 - mp objects
    import torch

    from probe_agent.collectors.peak import PeakFlops

    torch.set_num_threads(1)
    start.wait()
    out.put(PeakFlops(run_dir).get(torch, "cpu", "float32")[0])


def test_two_writers_racing_keep_every_key(tmp_path):
    # GIVEN two processes that each add 150 keys to the node's cache, one write at a time
    path = str(tmp_path / "cpu_peak.json")
    ctx = mp.get_context("fork")
    start = ctx.Event()
    procs = [ctx.Process(target=_add_keys, args=(path, p, start)) for p in ("a", "b")]
    for p in procs:
        p.start()
    # WHEN they start together
    start.set()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    # THEN no write lost the other's keys, and the file is whole JSON
    cache = json.loads((tmp_path / "cpu_peak.json").read_text())
    assert len(cache) == 2 * KEYS
    assert not list(tmp_path.glob("*.tmp"))


def test_two_ranks_asking_at_once_share_one_measurement(tmp_path):
    # GIVEN two fresh ranks of one node, no cached peak
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_peak, args=(str(tmp_path), start, out)) for _ in range(2)]
    for p in procs:
        p.start()
    # WHEN both ask for the CPU peak at the same moment
    start.set()
    got = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
    # THEN one probe ran: both hold the same figure, the one in the node's cache (two probes
    # would have read two different best times)
    cache = json.loads((tmp_path / "cpu_peak.json").read_text())
    assert len(cache) == 1
    assert got[0] == got[1] == next(iter(cache.values()))
