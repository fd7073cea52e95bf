"""``RankClient``: what a command may ask of one rank, live or dead.

Two implementations: ``ProbeClient`` (client.py: HTTP to a live agent) and
``PostmortemClient`` (postmortem.py: the same answers from a dead rank's copy, through a local
DuckDB). A verdict's evidence (gather/evidence.py) is gathered with these methods only, so
`probe hang`, `doctor` and `backtrace` read a copy as they read a job. The live client has more
(eval, actions, profiles); the copy refuses those with a line saying a live rank is needed.
mypy checks both classes against this protocol (``_conforms`` below), so the two cannot drift:
a method added to one and not the other is a type error, not a runtime AttributeError.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .client import ProbeClient
    from .postmortem import PostmortemClient


class RankClient(Protocol):
    """The read methods both clients answer, each returning the wire body (a dict) that the
    probe_protocol class of its route reads back."""

    def close(self) -> None: ...

    def query(self, sql: str, max_rows: int | None = None) -> dict[str, Any]: ...

    def canned(self, name: str, **params: Any) -> dict[str, Any]: ...

    def info(self) -> dict[str, Any]: ...

    def collectives(self, *, limit: int = 200, state: str | None = None) -> dict[str, Any]: ...

    def backtrace(self, *, locals: bool = False, native: bool = False, all: bool = False,
                  secrets: bool = False) -> dict[str, Any]: ...

    def doctor(self) -> dict[str, Any]: ...

    def doctor_grads(self, wait: float) -> dict[str, Any]: ...


def _conforms(live: ProbeClient, dead: PostmortemClient) -> tuple[RankClient, RankClient]:
    """Never called: mypy checks here that both clients are RankClients."""
    return live, dead
