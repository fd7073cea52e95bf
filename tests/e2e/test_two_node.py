"""The compose demo's 2-node job without containers: two torchrun invocations (--nnodes=2, node
ranks 0 and 1) on loopback, each started by docker/entrypoint.sh as the containers are, probed
from one address with a token."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_cluster import free_base_port
from tests.e2e.training import probe
from tests.support import ROOT, kill_tree, python_env, wait_until

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(300)
def test_two_nodes_from_the_compose_entrypoint(tmp_path: Path):
    # GIVEN the same entrypoint the containers run, once per "node", with a token file
    token_file = tmp_path / "token"
    token_file.write_text("two-node-secret\n")
    token_file.chmod(0o600)  # the agents refuse a token file others can read (issue 19)
    base = free_base_port(4)
    master = free_base_port(1)
    stop = tmp_path / "stop"
    procs = []
    for node in (0, 1):
        env = python_env(
            NODE_RANK=str(node), NNODES="2", NPROC="2", MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(master), PROBE_PORT=str(base + 2 * node),
            PROBE_TOKEN_FILE=str(token_file), PROBE_RUN_DIR=str(tmp_path / f"run{node}"),
            PROBE_WATCHDOG="0", PROBE_TRACE="off",
        )
        env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
        procs.append(subprocess.Popen(
            ["bash", str(ROOT / "docker" / "entrypoint.sh"), "--stop-file", str(stop)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        ))
    auth = {"PROBE_TOKEN": "two-node-secret"}
    try:
        def four_ranks() -> bool:
            for p in procs:
                assert p.poll() is None, f"a node exited early:\n{p.stdout.read()}"
            out = probe("-t", f"127.0.0.1:{base}", "--json", "info", env=auth)
            return out.returncode == 0 and len(json.loads(out.stdout)) == 4

        def registered() -> bool:
            """Rank 0's agent lists four ranks: polled in-process (a CLI process per poll took
            CPU from the four ranks starting up on two cores), before the CLI is asked."""
            for p in procs:
                assert p.poll() is None, f"a node exited early:\n{p.stdout.read()}"
            try:
                r = httpx.get(f"http://127.0.0.1:{base}/v1/ranks", timeout=10,
                              headers={"Authorization": "Bearer two-node-secret"})
            except httpx.HTTPError:
                return False
            return r.status_code == 200 and len(r.json().get("ranks") or ()) >= 4

        wait_until(registered, 180, "rank 0's agent never listed four ranks")
        # WHEN one address is asked (rank 0's agent), THEN all four ranks are discovered
        wait_until(four_ranks, 180, "four ranks on two nodes were not discovered")
        info = json.loads(probe("-t", f"127.0.0.1:{base}", "--json", "info", env=auth).stdout)
        assert [b["rank"] for b in info] == [0, 1, 2, 3]
        assert sorted(b["local_rank"] for b in info) == [0, 0, 1, 1]
        # AND a wrong token is refused (the job's owner on this machine needs none: issue 19;
        # tests/e2e/test_access_watchdog.py shows another uid needs it)
        denied = probe("-t", f"127.0.0.1:{base}", "info", env={"PROBE_TOKEN": "wrong"})
        assert denied.returncode == 1 and "wrong token" in denied.stderr
        # AND the hang verdict over the healthy job is clean
        hang = probe("-t", f"127.0.0.1:{base}", "hang", env=auth)
        assert hang.returncode == 0, hang.stdout + hang.stderr
    finally:
        stop.touch()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                kill_tree(p.pid)
                p.wait(10)
            p.stdout.close()
