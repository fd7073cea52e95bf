"""``RankClient``: what a command may ask of one rank, live or dead.

Two implementations: ``ProbeClient`` (client.py: HTTP to a live agent) and
``PostmortemClient`` (postmortem.py: the same answers from a dead rank's copy, through a local
DuckDB). A verdict's evidence (gather/evidence.py) is gathered with these methods only, so
`probe hang`, `doctor` and `backtrace` read a copy as they read a job. The live client has more
(eval, actions, profiles): a command reaches those through ``live(client, name)``, which a
copy answers with a rank failure saying a live rank is needed.

``Session.client`` returns a ``RankClient``: mypy checks both classes against this protocol
(``_conforms`` below), so the two cannot drift, and a command typed against it cannot call a
live-only method on a copy without going through ``live`` (a type error, not a runtime
AttributeError).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from .client import ProbeClient

if TYPE_CHECKING:
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
                  secrets: bool = False, children: bool = False) -> dict[str, Any]: ...

    def doctor(self) -> dict[str, Any]: ...

    def doctor_grads(self, wait: float) -> dict[str, Any]: ...


def _conforms(live: ProbeClient, dead: PostmortemClient) -> tuple[RankClient, RankClient]:
    """Never called: mypy checks here that both clients are RankClients."""
    return live, dead


def live(client: RankClient, method: str) -> ProbeClient:
    """``client`` as the live client, for ``method``, which only a live rank answers; a
    post-mortem copy raises its ``RankError`` saying so (that rank's failure, as any other)."""
    if isinstance(client, ProbeClient):
        return client
    from .postmortem import PostmortemClient

    if isinstance(client, PostmortemClient):
        raise client.needs_live(method)
    raise TypeError(f"not a rank client: {type(client).__name__}")
