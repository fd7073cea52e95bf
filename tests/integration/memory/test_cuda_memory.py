"""The CUDA side of memory (issue 29): the OOM caught in the act (python.ooms, <pid>.oom.json),
`probe memory --snapshot` (the allocator's history as memory_viz's pickle), fragmentation. The
CUDA tests skip without a GPU; what CPU can check (the refusal, the pure fragmentation rule, the
watchdog's wording) runs everywhere."""

from __future__ import annotations

import json
import os
import pickle

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("duckdb")

from probe_agent.collectors.oom import largest_free_block  # noqa: E402
from probe_agent.watchdog.rank import describe_exit  # noqa: E402
from probe_protocol.runfiles import RunFiles  # noqa: E402
from tests.integration.memory_support import run  # noqa: E402
from tests.integration.tracing_support import rows  # noqa: E402


def test_largest_free_block_reads_the_inactive_blocks_of_a_snapshot():
    snap = {"segments": [
        {"blocks": [{"size": 2 << 20, "state": "active_allocated"},
                    {"size": 6 << 20, "state": "inactive"}]},
        {"blocks": [{"size": 4 << 20, "state": "inactive"}]}]}
    assert largest_free_block(snap) == 6 << 20
    assert largest_free_block({"segments": []}) == 0


def test_the_watchdog_reports_the_oom_with_the_rank_s_exit():
    text = describe_exit({"code": 1, "exception": "OutOfMemoryError", "cuda_oom": {
        "step": 7, "device": "cuda:0", "request_mib": 512.0, "largest_free_block_mib": 300.0,
        "reserved_mib": 70_000.0, "capacity_mib": 81_559.0, "fragmented": True}})
    assert text.startswith("exited with code 1 after an uncaught OutOfMemoryError")
    assert "CUDA out of memory at step 7 on cuda:0: 512.0 MiB asked, largest free block " \
           "300.0 MiB" in text and "(fragmented)" in text


def test_snapshot_without_cuda_is_refused_with_what_to_do(make_agent, capsys, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this checks the CPU refusal")
    agent = make_agent(trace="off")
    code, out, err = run(capsys, agent, "memory", "--snapshot", "-o", str(tmp_path / "s.pickle"))
    assert code == 1 and "has not initialised CUDA" in err, (out, err)
    assert not (tmp_path / "s.pickle").exists()
    code, out, err = run(capsys, agent, "memory", "--snapshot")
    assert code == 2 and "--snapshot needs -o FILE" in err


def test_snapshot_never_writes_over_a_file_or_through_a_link(make_agent, capsys, tmp_path):
    """Checked before the steps are waited for, as every -o is (output_files.py); on CUDA the
    pickle is then written the same way (test_snapshot_records_... below)."""
    agent = make_agent(trace="off")
    kept = tmp_path / "kept.txt"
    kept.write_text("the owner's file\n")
    os.symlink(kept, tmp_path / "planted.pickle")
    for name in ("kept.txt", "planted.pickle"):
        code, out, err = run(capsys, agent, "memory", "--snapshot", "-o", str(tmp_path / name))
        assert code == 2 and "exists" in err and "--overwrite" in err, (out, err)
    assert kept.read_text() == "the owner's file\n"


@pytest.mark.cuda
def test_snapshot_records_the_allocator_history_of_the_next_steps(make_agent, capsys, tmp_path):
    agent = make_agent(trace="every:2")
    model = torch.nn.Linear(256, 256).cuda()
    opt = torch.optim.AdamW(model.parameters())
    import threading

    stop = threading.Event()

    def train() -> None:
        while not stop.is_set():
            model(torch.randn(64, 256, device="cuda")).sum().backward()
            opt.step()
            opt.zero_grad()

    t = threading.Thread(target=train, daemon=True)
    t.start()
    os.symlink(tmp_path / "kept.pickle", tmp_path / "planted.pickle")
    (tmp_path / "kept.pickle").write_bytes(b"kept")
    try:
        code, out, err = run(capsys, agent, "memory", "--snapshot", "--for", "3",
                             "-o", str(tmp_path / "s.pickle"))
        # --overwrite replaces a planted link itself, never the file it points to
        code2, _, err2 = run(capsys, agent, "memory", "--snapshot", "--overwrite",
                             "-o", str(tmp_path / "planted.pickle"))
    finally:
        stop.set()
        t.join(30)
    assert code == 0, err
    snap = pickle.loads((tmp_path / "s.pickle").read_bytes())
    assert snap["segments"] and any(trace for trace in snap["device_traces"])
    assert "memory_viz" in out
    assert code2 == 0 and not os.path.islink(tmp_path / "planted.pickle"), err2
    assert (tmp_path / "kept.pickle").read_bytes() == b"kept"


@pytest.mark.cuda
def test_an_oom_is_recorded_with_the_request_the_allocator_and_the_stack(make_agent, tmp_path):
    agent = make_agent(trace="on")
    model = torch.nn.Linear(512, 512).cuda()
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(3):  # the observer is attached at a step boundary once CUDA is initialised
        model(torch.randn(32, 512, device="cuda")).sum().backward()
        opt.step()
    free, total = torch.cuda.mem_get_info()
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(int(total * 2), dtype=torch.uint8, device="cuda")
    got = rows(agent, "SELECT request_mib, capacity_mib, largest_free_block_mib, fragmented, "
                      "params_mib, stack FROM python.ooms")
    [(request, capacity, largest, fragmented, params, stack)] = got
    assert request >= capacity * 1.5 and largest < request and fragmented is False
    assert params == pytest.approx(sum(p.numel() * 4 for p in model.parameters()) / 2**20)
    assert "test_an_oom_is_recorded" in stack
    rec = json.loads(open(RunFiles(agent.config.run_dir, os.getpid()).oom).read())
    assert rec["request_mib"] == pytest.approx(request)
