"""Start and stop real training processes for end-to-end tests (no sleeps: readiness files)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.support import PROGRAMS, kill_tree, python_env, wait_until


@contextmanager
def training_job(
    tmp: Path,
    program: str = "toy_train.py",
    args: tuple[str, ...] = (),
    nproc: int = 0,
    ranks: int = 1,
    env: dict[str, str] | None = None,
    timeout: float = 90,
    launcher: list[str] | None = None,
) -> Iterator[tuple[subprocess.Popen[str], list[dict]]]:
    """Run ``program`` (under torchrun when ``nproc``) with PROBE=1 and yield (proc, rank infos).

    ``launcher``: the command that starts ``nproc`` ranks instead of torchrun (``deepspeed
    --num_gpus 2``).

    Every rank writes ``rank{N}.json`` when it has taken its first step. On exit the stop file is
    created, then the whole process group is killed if it lingers.
    """
    ready = tmp / "ready"
    ready.mkdir(exist_ok=True)
    stop = tmp / "stop"
    child_env = python_env(**{
        "PROBE": "1", "PROBE_PORT": "0", "PROBE_RUN_DIR": str(tmp / "run"), "PROBE_WATCHDOG": "0",
        **(env or {}),
    })
    cmd = [sys.executable]
    if launcher:
        cmd = list(launcher)
        ranks = nproc
    elif nproc:
        cmd += ["-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
                "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0"]
        ranks = nproc
    cmd += [str(PROGRAMS / program), "--ready-dir", str(ready), "--stop-file", str(stop), *args]
    proc = subprocess.Popen(
        cmd, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    try:
        def all_ready() -> bool:
            assert proc.poll() is None, f"training exited early:\n{proc.stdout.read()}"
            return all((ready / f"rank{r}.json").exists() for r in range(ranks))

        wait_until(all_ready, timeout, "training ranks did not become ready")
        infos = [json.loads((ready / f"rank{r}.json").read_text()) for r in range(ranks)]
        if nproc > 1 and infos[0].get("url"):
            # Ranks register in the job's store from a thread of their agent: a command sent
            # through rank 0 before that reaches only some ranks (fsdp2's `probe slow` did,
            # under load). Wait for the real signal: rank 0 lists every rank.
            def registered() -> bool:
                assert proc.poll() is None, f"training exited early:\n{proc.stdout.read()}"
                body = httpx.get(f"{infos[0]['url']}/v1/ranks", timeout=10).json()
                return len(body.get("ranks") or ()) >= ranks

            wait_until(registered, timeout, "the ranks never all registered with rank 0")
        yield proc, infos
    finally:
        stop.touch()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            proc.wait(10)
        finally:
            if proc.stdout is not None:
                proc.stdout.close()  # else a ResourceWarning fails a later test (issue 6)


def probe(
    *args: str, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "probe_cli", *args],
        capture_output=True, text=True, timeout=timeout, env=python_env(**(env or {})),
    )
