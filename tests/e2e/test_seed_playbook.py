"""The seed playbook's commands, verbatim with `probe` for `probing`, against a live script.

The script keeps model/optimizer/train_loader/trainer at module level or inside main(); both must
work, through HOST:PORT and through a local PID (unix socket).
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.training import probe, training_job

pytestmark = pytest.mark.e2e

THREADS_EVAL = ("import threading\nfor t in threading.enumerate():\n"
                "    print(f'{t.name}: alive={t.is_alive()}')")
LR_EVAL = "for pg in optimizer.param_groups:\n    pg['lr'] *= 0.1"


@pytest.fixture(params=["module", "local"], ids=["module-level-names", "main-local-names"])
def job(request, tmp_path):
    with training_job(tmp_path, args=("--scope", request.param)) as (proc, infos):
        yield infos[0], tmp_path


@pytest.mark.timeout(180)
def test_seed_playbook_verbatim(job):
    info, tmp = job
    for endpoint in (info["url"].removeprefix("http://"), str(info["pid"])):
        env = {"PROBE_RUN_DIR": str(tmp / "run")}
        # backtrace
        bt = probe(endpoint, "backtrace", env=env)
        assert bt.returncode == 0, bt.stderr
        assert "train" in bt.stdout and "toy_train.py" in bt.stdout
        # query
        q = probe(endpoint, "query",
                  "SELECT func, file, lineno, depth FROM python.backtrace ORDER BY depth LIMIT 10",
                  env=env)
        assert q.returncode == 0, q.stderr
        assert "func" in q.stdout and "depth" in q.stdout
        # eval with real newlines
        ev = probe(endpoint, "eval", THREADS_EVAL, env=env)
        assert ev.returncode == 0, ev.stderr
        assert "MainThread: alive=True" in ev.stdout
        assert "probe-agent" not in ev.stdout.split("MainThread")[0]  # main listed first
        # DataLoader workers
        nw = probe(endpoint, "eval", "train_loader.num_workers", env=env)
        assert nw.returncode == 0 and nw.stdout.strip().endswith("0"), nw.stdout + nw.stderr


@pytest.mark.timeout(180)
def test_seed_playbook_lr_and_checkpoint(job):
    info, tmp = job
    endpoint = info["url"].removeprefix("http://")
    before = probe(endpoint, "--json", "eval", "optimizer.param_groups[0]['lr']")
    assert before.returncode == 0, before.stderr
    lr0 = float(json.loads(before.stdout)[0]["result"])

    change = probe(endpoint, "eval", LR_EVAL)
    after = probe(endpoint, "--json", "eval", "optimizer.param_groups[0]['lr']")
    assert change.returncode == 0, change.stderr
    assert float(json.loads(after.stdout)[0]["result"]) == pytest.approx(lr0 * 0.1)

    ckpt = tmp / "ckpt.pt"
    save = probe(endpoint, "eval",
                 "torch.save({'model': model.state_dict(), "
                 f"'optimizer': optimizer.state_dict()}}, {str(ckpt)!r})")
    assert save.returncode == 0, save.stderr
    import torch

    state = torch.load(ckpt)
    assert set(state) == {"model", "optimizer"} and state["model"]
