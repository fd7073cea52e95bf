"""What the CLI says about a step-boundary action, against a real in-process agent whose
"training thread" is a test thread (tests/integration/test_actions_agent.py's Trainer).

Every sentence must be true on the rank it names: an action the training thread is running
was not cancelled, and one that may still run was not "nothing ran".
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from probe_cli.main import main
from tests.integration.test_actions_agent import Trainer, trainer_running
from tests.support import wait_until

pytest.importorskip("torch")


@pytest.fixture
def running_trainer() -> Iterator[Trainer]:
    with trainer_running(free=True) as t:
        yield t


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_running_action_is_not_reported_as_cancelled(
    agent: object, running_trainer: Trainer, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`eval --next-step --wait 10 "time.sleep(600)"` printed both "the action was cancelled
    on rank 1" and "still running on the training thread"."""
    wait_until(lambda: running_trainer.steps > 2, 30, "the trainer did not step")
    release = tmp_path / "release"
    code = (f"import os, time\nwhile not os.path.exists({str(release)!r}):\n"
            "    time.sleep(0.01)\n")
    try:
        # WHEN the CLI gives up on an action the training thread is running
        rc, out, err = run(capsys, agent.url.removeprefix("http://"),  # type: ignore[attr-defined]
                           "eval", "--next-step", "--wait", "3", code)
    finally:
        release.touch()
    # THEN it says the action still runs there, and never that it was cancelled
    assert rc != 0, (out, err)
    assert "still running on rank 0's training thread" in err, err
    assert "cancelled" not in err, err


def test_the_action_id_is_an_idempotency_key(
    client: object, running_trainer: Trainer,
) -> None:
    wait_until(lambda: running_trainer.steps > 2, 30, "the trainer did not step")
    body = {"kind": "lr", "scale": 0.5, "id": "A17", "step": running_trainer.steps + 10_000}
    # WHEN the same request is sent twice (its first answer was lost)
    first = client.post("/v1/actions", json=body)  # type: ignore[attr-defined]
    again = client.post("/v1/actions", json=body)  # type: ignore[attr-defined]
    # THEN the retry gets the first action back, and one action is queued
    assert first.status_code == again.status_code == 200, (first.text, again.text)
    assert again.json()["action"]["submitted_at"] == first.json()["action"]["submitted_at"]
    listed = client.get("/v1/actions").json()["actions"]  # type: ignore[attr-defined]
    assert [a["id"] for a in listed] == ["A17"], listed
    # AND the same id for another request is refused
    other = client.post("/v1/actions", json={**body, "scale": 0.25})  # type: ignore[attr-defined]
    assert other.status_code == 409 and other.json()["reason"] == "duplicate", other.text
