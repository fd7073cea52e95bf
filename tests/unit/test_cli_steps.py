"""probe_cli.transport.step_actions.choose_next_step: "the smallest step that no rank has
passed yet" (issue 6)."""

from __future__ import annotations

import pytest

from probe_cli.transport.step_actions import choose_next_step


@pytest.mark.parametrize(
    "bodies, expected",
    [
        pytest.param([{"step": 7}, {"step": 9}], 10, id="max-plus-one"),
        pytest.param([{"step": 9, "paused_at": 9}, {"step": 9, "paused_at": 9}], 9,
                     id="all-held-at-9-run-there"),
        pytest.param([{"step": 9, "paused_at": 9}, {"step": 9, "paused_at": None}], 10,
                     id="one-not-held"),
        pytest.param([{"step": None}, {"step": 4}], 5, id="a-rank-before-its-first-step"),
        pytest.param([{"step": None}, {"step": None}], None, id="no-rank-has-stepped"),
    ],
)
def test_choose_next_step(bodies: list[dict], expected: int | None) -> None:
    assert choose_next_step(bodies) == expected
