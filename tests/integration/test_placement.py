"""Where each step ran (python.steps boot_id, cpu_affinity, load_1m): the straggler verdict
compares the ranks' machines and CPUs to tell shared cores from a rank's own busy ones. A real
agent and a real torch loop on a thread pinned to one CPU."""

from __future__ import annotations

import os
import threading

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("duckdb")

from probe_agent.store.catalog import shipped_sql  # noqa: E402
from probe_protocol.cpulist import cpu_list  # noqa: E402
from tests.integration.tracing_support import rows  # noqa: E402


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux CPU affinity")
def test_each_step_records_the_training_threads_cpus_and_machine(make_agent):
    # GIVEN an agent, and a loop on a thread pinned to one CPU (affinity is per thread: the
    # process and the agent's threads keep every CPU)
    agent = make_agent(trace="off")
    one = min(os.sched_getaffinity(0))
    errors: list[BaseException] = []

    def train() -> None:
        try:
            os.sched_setaffinity(0, {one})
            model = torch.nn.Linear(4, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(4):
                model(torch.randn(8, 4)).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
        except BaseException as e:  # noqa: BLE001 - reported by the test thread
            errors.append(e)

    t = threading.Thread(target=train)
    t.start()
    t.join(60)
    assert not errors and not t.is_alive(), errors
    # THEN every step names the pinned CPU, this kernel's boot id and a load
    got = rows(agent, "SELECT step, boot_id, cpu_affinity, load_1m FROM python.steps "
                      "ORDER BY step")
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
        boot = f.read().strip()
    assert [r[0] for r in got] == [1, 2, 3, 4], got
    assert all(r[1] == boot and r[2] == cpu_list({one}) and r[3] >= 0 for r in got), got
    # AND the straggler verdict's query sums the training thread's time over the steps of a
    # window, on a CPU and waiting for one, and says where the last of them ran
    res = agent.store.query(shipped_sql("cpu_window"), params={"since": 0.0})
    row = dict(zip(res.columns, res.rows[0], strict=True))
    assert row["steps"] == 4 and row["boot_id"] == boot, row
    assert row["cpu_affinity"] == cpu_list({one}), row
    assert 0 < row["cpu_run_share"] <= 1 and 0 <= row["cpu_wait_share"] <= 1, row
    # AND a window that starts after the last step holds none
    res = agent.store.query(shipped_sql("cpu_window"), params={"since": 2e10})
    assert res.rows[0][0] == 0 and res.rows[0][1] is None, res.rows
