"""Actions that cannot destroy (issue 20, item 6), against a real in-process agent and torch.

`checkpoint` writes only regular files: an existing file needs ``overwrite``; a device, a FIFO,
a directory (or a link to one) is refused always, on submit and again right before the rename;
a full disk says so, with the size needed, and leaves no temporary file. `lr` refuses values
that are not finite JSON numbers, and changes beyond 10x unless ``force``. After every refusal
the training thread keeps stepping.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fullfs import fill
from tests.integration.test_actions_agent import Trainer, post, trainer_running

torch = pytest.importorskip("torch")


@pytest.fixture
def stepping() -> Iterator[Trainer]:
    """A Trainer (tests/integration/test_actions_agent.py) that has taken its first step."""
    with trainer_running(free=False) as trainer:
        trainer.step()
        yield trainer


def run_action(client: httpx.Client, trainer: Trainer, **body: object) -> dict:
    """Queue an action, take one step, and return the finished action."""
    r = post(client, **body)
    assert r.status_code == 200, r.text
    trainer.step()
    a = client.get(f"/v1/actions/{r.json()['action']['id']}", params={"wait": 10})
    return a.json()["action"]


# -- checkpoint -------------------------------------------------------------------------------

def test_an_existing_file_is_refused_unless_overwrite(
    client: httpx.Client, stepping: Trainer, tmp_path: Path
) -> None:
    # GIVEN a file the user cares about
    mine = tmp_path / "notes.txt"
    mine.write_text("precious")
    # WHEN a checkpoint is asked for at that path
    r = post(client, kind="checkpoint", path=str(mine))
    # THEN it is refused at once, with what to do, and the file is unchanged
    assert r.status_code == 409, r.text
    assert r.json()["reason"] == "exists"
    assert "exists (a file): pass --overwrite" in r.json()["error"]
    assert mine.read_text() == "precious"
    stepping.step(2)  # training goes on
    # WHEN overwrite is given
    a = run_action(client, stepping, kind="checkpoint", path=str(mine), overwrite=True)
    # THEN the checkpoint replaces it, and no temporary file is left
    assert a["state"] == "ok", a
    assert torch.load(mine, weights_only=False)["probe_checkpoint"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_a_file_that_appears_before_the_rename_is_not_replaced(
    client: httpx.Client, stepping: Trainer, tmp_path: Path
) -> None:
    """The check runs again on the training thread: a file created after submit survives."""
    path = tmp_path / "late.pt"
    r = post(client, kind="checkpoint", path=str(path), id="late")
    assert r.status_code == 200, r.text
    path.write_text("arrived after submit")
    stepping.step()
    a = client.get("/v1/actions/late", params={"wait": 10}).json()["action"]
    assert a["state"] == "error" and "exists (a file): pass --overwrite" in a["error"], a
    assert path.read_text() == "arrived after submit"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["late.pt"]
    stepping.step(2)


@pytest.mark.parametrize("overwrite", [False, True], ids=["plain", "overwrite"])
def test_dev_null_is_refused_and_stays_a_device(
    client: httpx.Client, stepping: Trainer, overwrite: bool
) -> None:
    # WHEN a checkpoint is aimed at a character device (as root, a rename would replace it)
    r = post(client, kind="checkpoint", path="/dev/null", overwrite=overwrite)
    # THEN it is refused either way, and /dev/null is still a character device
    assert r.status_code == 400, r.text
    assert "/dev/null is a character device" in r.json()["error"]
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    stepping.step(2)


def test_a_device_made_after_submit_is_not_replaced(
    client: httpx.Client, stepping: Trainer, tmp_path: Path, char_device: Path
) -> None:
    """The check before the rename: a device that appears at PATH after the submit-time check
    (here: moved there) survives, with --overwrite too."""
    path = tmp_path / "ck.pt"
    r = post(client, kind="checkpoint", path=str(path), overwrite=True, id="dev")
    assert r.status_code == 200, r.text
    os.rename(char_device, path)
    stepping.step()
    a = client.get("/v1/actions/dev", params={"wait": 10}).json()["action"]
    assert a["state"] == "error" and "is a character device" in a["error"], a
    assert stat.S_ISCHR(os.lstat(path).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck.pt"]
    stepping.step(2)


def test_a_symlink_to_a_device_a_fifo_and_a_directory_are_refused(
    client: httpx.Client, stepping: Trainer, tmp_path: Path
) -> None:
    link = tmp_path / "link"
    link.symlink_to("/dev/null")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    plain_dir = tmp_path / "dir"
    plain_dir.mkdir()
    for path, said in ((link, "a symlink to a character device"), (fifo, "a FIFO"),
                       (plain_dir, "a directory and not a torch.distributed.checkpoint")):
        for overwrite in (False, True):
            r = post(client, kind="checkpoint", path=str(path), overwrite=overwrite)
            assert r.status_code == 400, (path, r.text)
            assert f"{path} is {said}" in r.json()["error"], r.text
    assert link.is_symlink() and stat.S_ISFIFO(os.lstat(fifo).st_mode) and plain_dir.is_dir()
    stepping.step(2)


def test_a_checkpoint_directory_is_never_replaced_by_a_replicated_checkpoint(
    client: httpx.Client, stepping: Trainer, tmp_path: Path
) -> None:
    """A sharded checkpoint's directory (``.metadata``) passes submit with overwrite; the
    replicated writer still refuses it on the training thread."""
    dcp_dir = tmp_path / "sharded"
    dcp_dir.mkdir()
    (dcp_dir / ".metadata").write_bytes(b"x")
    a = run_action(client, stepping, kind="checkpoint", path=str(dcp_dir), overwrite=True)
    assert a["state"] == "error" and "is a directory: give a file path" in a["error"], a
    assert (dcp_dir / ".metadata").read_bytes() == b"x"


def test_a_relative_path_is_refused_by_the_api(client: httpx.Client, stepping: Trainer) -> None:
    r = post(client, kind="checkpoint", path="ck.pt")
    assert r.status_code == 400
    assert "relative: give an absolute path" in r.json()["error"]


def test_a_full_disk_says_so_with_the_size_needed(
    client: httpx.Client, stepping: Trainer, full_disk: Path
) -> None:
    # GIVEN a filesystem with 8 KiB left
    fill(full_disk, 8 << 10)
    # WHEN a checkpoint is written there
    a = run_action(client, stepping, kind="checkpoint", path=str(full_disk / "ck.pt"))
    # THEN it says the disk is full, where, and how much was needed vs free; nothing is left
    assert a["state"] == "error", a
    assert a["error"].startswith(f"CheckpointError: disk full: {full_disk} has 8.0 KiB free "
                                 "and the checkpoint needs about "), a["error"]
    assert sorted(p.name for p in full_disk.iterdir()) == ["hog"]
    stepping.step(2)


def test_enospc_during_the_write_is_reported_and_the_tmp_removed(
    full_disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When statvfs showed room but the write still ran out (another writer, a quota), torch's
    ``enforce fail at inline_container.cc`` becomes the disk-full line."""
    import probe_agent.actions.checkpoint as ck
    from probe_agent.actions.checkpoint_target import CheckpointError

    # GIVEN another writer that fills the disk right after the preflight check
    monkeypatch.setattr(ck, "preflight", lambda directory, needed: fill(full_disk, 4096))
    # WHEN 400 kB of weights are saved there
    with pytest.raises(CheckpointError) as info:
        ck.write_atomic(str(full_disk / "ck.pt"), {"w": torch.zeros(100_000)}, "t1")
    # THEN the message says disk full and the estimate, and the temporary file is gone
    msg = str(info.value)
    assert msg.startswith(f"disk full (No space left on device) at {full_disk}: the checkpoint "
                          "needs about 406.9 KiB and "), msg
    assert "the temporary file was removed" in msg and "enforce fail" not in msg
    assert sorted(p.name for p in full_disk.iterdir()) == ["hog"]


# -- lr ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("body, status, said", [
    ({"set": 1e30}, 400, "lr --set 1e+30 refused: 1e+31x the current largest LR (0.1, SGD[0])"),
    ({"scale": 50}, 400, "lr --scale 50 refused: more than 10x the current LR"),
    ({"set": 0}, 400, "an LR of 0 stops training"),
    ({"set": True}, 422, "set: Value error, give a JSON number, not bool True"),
    ({"scale": True}, 422, "scale: Value error, give a JSON number, not bool True"),
    ({"set": "0.5"}, 422, "give a JSON number, not str"),
    ({"set": -1}, 422, "set: Input should be greater than or equal to 0"),
    ({"step": True, "set": 0.05}, 422, "step: Value error, give a JSON number, not bool"),
    ({"set": 0.05, "force": "yes"}, 422, "force: Input should be a valid boolean"),
], ids=["1e30", "scale-50", "zero", "true", "scale-true", "string", "negative", "step-true",
        "force-string"])
def test_lr_refusals_over_the_api(client: httpx.Client, stepping: Trainer, body: dict,
                                  status: int, said: str) -> None:
    r = post(client, kind="lr", **body)
    assert r.status_code == status, r.text
    assert said in r.json()["error"], r.json()["error"]
    stepping.step(2)
    lr = client.post("/v1/eval", json={"code": "1"})  # the agent still answers
    assert lr.status_code == 200
    assert client.get("/v1/actions").json()["actions"] == []  # nothing was queued


@pytest.mark.parametrize("raw", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_lr_non_finite_json_is_refused(client: httpx.Client, stepping: Trainer,
                                       raw: str) -> None:
    r = client.post("/v1/actions", content=f'{{"kind": "lr", "set": {raw}}}',
                    headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert "finite number" in r.json()["error"]
    stepping.step()


def test_lr_force_allows_a_large_change(client: httpx.Client, stepping: Trainer) -> None:
    a = run_action(client, stepping, kind="lr", set=5.0, force=True)
    assert a["state"] == "ok", a
    assert a["data"]["optimizers"][0]["groups"][0]["after"] == 5.0
    assert a["code"] == "lr set=5.0 force"
    stepping.step(2)
