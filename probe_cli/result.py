"""RankResult: what one rank answered (or why it did not). Stdlib only, so render/ and its
tests need neither httpx nor a server."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import AgentTimeoutError, ProbeCLIError


@dataclass(frozen=True, slots=True)
class RankResult:
    """What one rank answered.

    Attributes:
        ok: the rank answered with ``ok: true``.
        data: the wire body: the success body, or the agent's error body when it sent one
            (eval's carries ``traceback``); None when nothing came back.
        error: why this rank failed; None when ``ok``.
    """

    rank: int | None
    url: str
    ok: bool
    data: dict[str, Any] | None = None
    error: ProbeCLIError | None = None
    host: str | None = None
    pid: int | None = None

    @property
    def silent(self) -> bool:
        """The rank did not answer within the timeout."""
        return isinstance(self.error, AgentTimeoutError)


def result_order(r: RankResult) -> tuple[bool, int, str]:
    return (r.rank is None, r.rank if r.rank is not None else 0, r.url)
