"""Exit codes and the multi-rank failure summary (pure; no server)."""

from __future__ import annotations

import pytest

from probe_cli.errors import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_PARTIAL,
    AgentTimeoutError,
    AgentUnreachableError,
    AuthError,
)
from probe_cli.outcome import exit_code, failure_summary
from probe_cli.result import RankResult

TOKEN_MSG = "wrong token: pass the job's token with --token-file FILE (or --token, PROBE_TOKEN)"


def ok(rank: int) -> RankResult:
    return RankResult(rank, f"http://h:{rank}", True, {"ok": True, "rank": rank})


def silent(rank: int) -> RankResult:
    e = AgentTimeoutError(f"agent at http://h:{rank} did not answer within 5 s",
                          url=f"http://h:{rank}", reason="timeout 5 s")
    return RankResult(rank, f"http://h:{rank}", False, None, e)


def unauthorised(rank: int) -> RankResult:
    body = {"ok": False, "rank": rank, "status": 401, "error": TOKEN_MSG}
    e = AuthError(f"agent at http://h:{rank} answered HTTP 401: {TOKEN_MSG}",
                  url=f"http://h:{rank}", reason=f"HTTP 401: {TOKEN_MSG}", status=401, body=body)
    return RankResult(rank, f"http://h:{rank}", False, body, e)


def refused(rank: int | None) -> RankResult:
    url = f"http://h:{rank}"
    e = AgentUnreachableError(f"cannot reach agent at {url}: connection refused.", url=url,
                              reason="connection refused")
    return RankResult(rank, url, False, None, e)


@pytest.mark.parametrize(
    ("results", "code"),
    [
        ([ok(0), ok(1)], EXIT_OK),
        ([ok(0), silent(1)], EXIT_PARTIAL),
        ([silent(0), refused(1)], EXIT_FAILURE),
        ([], EXIT_FAILURE),
    ],
    ids=["all-ok", "partial", "none", "no-ranks"],
)
def test_exit_code(results, code):
    assert exit_code(results) == code


def test_partial_summary_names_silent_and_failed_ranks():
    # GIVEN 64 ranks: 17 and 40 silent, 3 with a wrong token
    results = [ok(r) for r in range(64) if r not in (3, 17, 40)]
    results += [silent(17), silent(40), unauthorised(3)]
    # WHEN summarised
    lines = failure_summary(sorted(results, key=lambda r: r.rank), timeout=5)
    # THEN one line with counts and both kinds, then what to do for the silent ones
    assert lines[0] == (
        f"probe: 61/64 ranks answered; silent: 17,40 (timeout 5 s); failed: 3 (HTTP 401: "
        f"{TOKEN_MSG})"
    )
    assert any(line.startswith("hint: raise --timeout") for line in lines[1:])
    # the 401's own message already says what to do: no duplicate hint
    assert not any("PROBE_TOKEN" in line for line in lines[1:])


def test_nothing_answered_one_cause_prints_its_message_and_note():
    lines = failure_summary([refused(None)], 5, note="no target given, so probe used ...")
    assert lines[0] == "probe: cannot reach agent at http://h:None: connection refused."
    assert lines[1].startswith("hint: is the job running with the agent? Start it with PROBE=1")
    assert lines[2] == "note: no target given, so probe used ..."


def test_nothing_answered_many_ranks_groups_by_reason():
    lines = failure_summary([refused(0), refused(1), refused(2), silent(3)], 5)
    assert lines[0] == (
        "probe: no rank answered; silent: 3 (timeout 5 s); failed: 0–2 (connection refused)"
    )


def test_all_ok_has_no_summary():
    assert failure_summary([ok(0)], 5) == []
