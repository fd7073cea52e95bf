"""``ActionKind``: what one kind of step-boundary action is, declared once by its own module
(kinds/__init__.py lists them).

A kind says how a request for it is checked (``validate``: the shape, a 422 with its message;
``check``: against the live job at submission, a 4xx, e.g. a checkpoint path that exists), what
the queued action keeps of the request (``args``), how `probe actions` shows it (``describe``)
and what it does on the training thread at step N (``run``, which fills ``a.result`` and
``a.data`` and raises on failure; the queue records the state, the timing and the traceback).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..queue import Action, ActionQueue

#: The request's fields as the route read them (name -> value; absent ones are None).
Fields = Mapping[str, Any]


def no_args(_: Fields) -> dict[str, Any]:
    return {}


def no_check(_q: ActionQueue, _args: dict[str, Any]) -> None:
    return None


def no_problem(_: Fields) -> str | None:
    return None


@dataclass(frozen=True, slots=True)
class ActionKind:
    """One kind of step-boundary action.

    Args:
        name: the request's ``kind`` and the CLI's word for it.
        run: on the training thread right after step N (every targeted rank agreed).
        describe: the one line `probe actions` and the audit table show for the request.
        args: what the queued action keeps of the request (its ``args``; a retry with the
            same ones is recognised as the same request).
        validate: a message when the request cannot be for this kind (HTTP 422), else None.
        check: refuses at submission (4xx) what ``run`` would refuse at the step boundary,
            since the API is reachable without the CLI; may fill defaults into ``args``.
    """

    name: str
    run: Callable[[ActionQueue, Action, int], None]
    describe: Callable[[Fields], str]
    args: Callable[[Fields], dict[str, Any]] = no_args
    validate: Callable[[Fields], str | None] = no_problem
    check: Callable[[ActionQueue, dict[str, Any]], None] = no_check


def present(fields: Fields, *names: str) -> dict[str, Any]:
    """``names`` of ``fields`` that were given: values not None, flags only when true."""
    out: dict[str, Any] = {}
    for name in names:
        v = fields.get(name)
        if v is None or v is False:
            continue
        out[name] = v
    return out
