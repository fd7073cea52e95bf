"""python.collectives and /v1/ranks inside one real process: gloo with world size 1.

The agent starts before the process group exists (as under PROBE=1) and must arm itself once
``init_process_group`` has run: publish its URL in the job's store, wrap the torch.distributed
functions, and merge the Flight Recorder (which alone sees DDP's gradient all-reduces).
"""

from __future__ import annotations

import os

import pytest

from tests.support import wait_until

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")


@pytest.fixture
def process_group(agent):
    # GIVEN a running agent, then a gloo group over a real TCPStore on a free port
    store = dist.TCPStore("127.0.0.1", 0, world_size=1, is_master=True, wait_for_workers=False)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield agent
    dist.destroy_process_group()


def sync_loss(t):
    dist.all_reduce(t)  # the call site the rows must name


def test_rank_publishes_itself_in_the_job_store(process_group, client):
    agent = process_group
    # WHEN the writer tick sees the initialised group
    wait_until(lambda: agent.peers, 10, "the registry never published rank 0")
    # THEN /v1/ranks serves the entry read back from the store
    ranks = client.get("/v1/ranks").json()["ranks"]
    assert ranks == [{"rank": 0, "url": agent.url, "host": agent.identity.host,
                      "pid": os.getpid()}]
    key = dist.PrefixStore("probe_agent", dist.distributed_c10d._get_default_store()
                           ._underlying_non_prefix_store)
    assert key.check(["rank0"])


def test_explicit_and_ddp_collectives_are_recorded(process_group, client):
    agent = process_group
    wait_until(lambda: agent.collectors.collectives._armed, 10, "wrappers not installed")
    # GIVEN a DDP step (its all-reduce never passes through Python) and an explicit all_reduce
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    model(torch.randn(3, 4)).sum().backward()
    sync_loss(torch.ones(5))
    # WHEN
    rows = client.post("/v1/query", json={"sql": (
        "SELECT seq, op, state, source, callsite, shapes, dtype, duration IS NOT NULL, "
        "group_ranks FROM python.collectives ORDER BY seq")}).json()["rows"]
    # THEN the explicit call is matched to its Flight Recorder entry, with timing and call site
    explicit = [r for r in rows if r[3] == "both"]
    assert len(explicit) == 1, rows
    seq, op, state, _, site, shapes, dtype, timed, group = explicit[0]
    assert (op, state, shapes, dtype, timed, group) == ("all_reduce", "done", "[[5]]", "float32",
                                                        True, [0])
    assert site.endswith(f"{os.path.basename(__file__)}:{sync_loss.__code__.co_firstlineno + 1}"
                         " sync_loss")
    # AND DDP's gradient all-reduce is there too, from the Flight Recorder only
    ddp = [r for r in rows if r[3] == "flight_recorder" and r[1] == "all_reduce"]
    assert ddp and ddp[-1][0] < seq and "test_collectives.py" in ddp[-1][4]
    seqs = [r[0] for r in rows]
    assert seqs == sorted(set(seqs)), "one row per collective, numbered by the group"


def test_failed_collective_is_recorded_and_reraised(process_group, client):
    agent = process_group
    wait_until(lambda: agent.collectors.collectives._armed, 10, "wrappers not installed")
    with pytest.raises((ValueError, RuntimeError)):
        dist.broadcast(torch.ones(2), src=5)  # no rank 5 in a group of one
    body = client.get("/v1/collectives", params={"state": "failed"}).json()
    assert body["ok"] and body["collectives"][-1]["op"] == "broadcast"
    assert body["collectives"][-1]["error"]


def test_stop_restores_the_torch_functions(make_agent):
    original = dist.all_reduce
    agent = make_agent()
    agent.collectors.collectives.tick()
    assert dist.all_reduce is not original
    import probe_agent

    probe_agent.stop()
    assert dist.all_reduce is original
    assert dist.distributed_c10d.all_reduce is original


def test_metrics_count_only_collectives_still_pending(process_group, client):
    agent = process_group
    wait_until(lambda: agent.collectors.collectives._armed, 10, "wrappers not installed")
    # GIVEN finished DDP all-reduces (gloo: the Flight Recorder gives them no end time)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    for _ in range(3):
        model(torch.randn(3, 4)).sum().backward()
    sync_loss(torch.ones(5))
    body = client.post("/v1/query", json={"sql": "SELECT count(*) FROM python.collectives "
                                                 "WHERE end_time IS NULL"}).json()
    assert body["rows"][0][0] >= 3, body
    # WHEN Prometheus scrapes the rank
    text = client.get("/v1/metrics").text
    values = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith("probe_collective")}
    # THEN none of them counts as pending or waiting (a healthy job is not stuck)
    assert values["probe_collectives_pending"] == 0, text
    assert values["probe_collective_wait_seconds"] == 0, text


def scatter_grads(out, x):
    dist.reduce_scatter_tensor(out, x)  # the call site the row must name


def scatter_unwrapped(out, x):
    # bound before the recorder wrapped it: only the Flight Recorder sees this call
    dist.distributed_c10d.reduce_scatter_tensor.__wrapped__(out, x)


@pytest.mark.filterwarnings("ignore:`torch.distributed.*` is deprecated:FutureWarning")
def test_reduce_scatter_is_named_for_what_was_asked_and_where(process_group, client):
    """gloo runs reduce_scatter_tensor as an all-reduce and its Flight Recorder records
    ``all_reduce``; the row says reduce_scatter, at the caller (not typing_extensions.py's
    deprecation wrapper that sits above it in torch 2.13)."""
    agent = process_group
    wait_until(lambda: agent.collectors.collectives._armed, 10, "wrappers not installed")
    # GIVEN a reduce_scatter_tensor through torch.distributed, one past the recorder's wrapper,
    # and an all_gather_into_tensor
    x, out = torch.ones(4), torch.empty(4)
    scatter_grads(out, x)
    scatter_unwrapped(out, x)
    dist.all_gather_into_tensor(x, out)
    # WHEN
    rows = client.post("/v1/query", json={"sql": (
        "SELECT op, source, callsite FROM python.collectives ORDER BY start_time")}).json()["rows"]
    # THEN each is named for its API and its caller (earlier tests' groups left rows too)
    assert [r[:2] for r in rows[-3:]] == [["reduce_scatter", "both"],
                                          ["reduce_scatter", "flight_recorder"],
                                          ["all_gather", "both"]], rows
    assert rows[-3][2].endswith("scatter_grads"), rows
    assert "test_collectives.py" in rows[-2][2] and rows[-2][2].endswith("scatter_unwrapped")
    assert "test_collectives.py" in rows[-1][2], rows
