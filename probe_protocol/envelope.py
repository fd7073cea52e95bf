"""What every body carries, how bodies are written, and how they are read.

- Every body carries ``ok`` and ``rank``, first.
- An error body (every non-2xx answer) has exactly four required keys, in this order: ``ok``
  (False), ``rank``, ``status`` (the HTTP status again, for clients that only see the body) and
  ``error`` (a message for a person); routes may add keys (``traceback``, ``reason``...).
- A success body is a frozen dataclass (``WireBody``): ``to_wire()`` writes ``ok``, ``rank``,
  then its fields in declaration order, leaving out a field whose ``omit`` rule says so
  (``sometimes()``); ``from_wire()`` reads it back, each field by its declared type
  (``READERS``), so a new body is its fields and nothing more.

Reading is tolerant, as the CLI's renderers always were: a missing, null or mistyped key becomes
the field's empty value, never a KeyError, so an older or newer agent still renders. Nested
items that renderers walk as mappings (threads, frames, collectives, actions) stay dicts; their
keys are listed in docs/http-api.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, TypeVar

Body = Mapping[str, Any]


def sometimes(when: Callable[[Any], bool] | None = None, default: Any = None) -> Any:
    """A field sent only sometimes: when ``when(body)`` is true, or (without ``when``) when it
    is not None. Other fields are always sent, null or not."""
    return field(default=default, metadata={"sent": when or "not-none"})


W = TypeVar("W", bound="WireBody")


class WireBody:
    """Mixin for success bodies (dataclasses with a ``rank`` field). ``from_wire`` reads each
    field by its declared type (``READERS``); a body whose field needs more says so in its own
    ``from_wire``."""

    __slots__ = ()

    @classmethod
    def from_wire(cls: type[W], body: Body | None) -> W:
        """The body as sent: each field read by its type's tolerant reader; a missing, null or
        mistyped value leaves the field's default."""
        b = body or {}
        kw: dict[str, Any] = {}
        for name, read, keep_default in _reading_plan(cls):
            value = read(b.get(name))
            if value is not None or not keep_default:
                kw[name] = value
        return cls(**kw)

    def to_wire(self) -> dict[str, Any]:
        """The body as the agent sends it (and as ``--json`` prints it)."""
        out: dict[str, Any] = {"ok": True, "rank": getattr(self, "rank")}
        for name, sent in _writing_plan(type(self)):
            value = getattr(self, name)
            if sent is not None and not (value is not None if sent == "not-none" else sent(self)):
                continue
            out[name] = list(value) if isinstance(value, tuple) else value
        return out


# Per class, worked out once: ``fields()`` and its metadata cost ~40 us a body otherwise, on
# routes (the backtrace) that must stay instant.
_WRITING: dict[type, tuple[tuple[str, Any], ...]] = {}
_READING: dict[type, tuple[tuple[str, Callable[[Any], Any], bool], ...]] = {}


def _writing_plan(cls: type) -> tuple[tuple[str, Any], ...]:
    plan = _WRITING.get(cls)
    if plan is None:
        plan = _WRITING[cls] = tuple((f.name, f.metadata.get("sent")) for f in fields(cls)
                                     if f.name != "rank")
    return plan


def _reading_plan(cls: type) -> tuple[tuple[str, Callable[[Any], Any], bool], ...]:
    """(name, reader, keep the default when the value is None) per field."""
    plan = _READING.get(cls)
    if plan is None:
        plan = _READING[cls] = tuple(
            (f.name, READERS[f.type],  # type: ignore[index]
             f.default_factory is not MISSING or f.default not in (None, MISSING))
            for f in fields(cls))
    return plan


@dataclass(frozen=True, slots=True)
class ErrorBody:
    """An error body. Required keys, for every non-2xx answer:

    - ``ok``: always False;
    - ``rank``: the rank that answered (the watchdog answers for its rank);
    - ``status``: the HTTP status, repeated for clients that only see the body;
    - ``error``: what went wrong and, where there is one, what to do about it.

    ``extra`` keys follow them (eval's ``traceback``, an action refusal's ``reason``...).
    """

    rank: int | None
    status: int
    error: str
    extra: dict[str, Any] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        return {"ok": False, "rank": self.rank, "status": self.status, "error": self.error,
                **self.extra}

    @classmethod
    def from_wire(cls, body: Body | None) -> ErrorBody:
        b = dict(body or {})
        rest = {k: v for k, v in b.items() if k not in ("ok", "rank", "status", "error")}
        return cls(as_int(b.get("rank")), as_int(b.get("status")) or 0,
                   str(b.get("error") or ""), rest)


def error_body(rank: int | None, status: int, message: str, **extra: Any) -> dict[str, Any]:
    """An error body as a dict (``ErrorBody``'s wire form)."""
    return ErrorBody(rank, status, message, extra).to_wire()


def encode(body: Mapping[str, Any]) -> bytes:
    """A body as the bytes on the wire (what is not JSON becomes its ``str``)."""
    return json.dumps(body, default=str).encode()


@dataclass(frozen=True, slots=True)
class Envelope:
    """What every body carries: ``ok``, ``rank``; error bodies add ``status`` and ``error``."""

    ok: bool | None
    """As sent: True, False, or None when the body did not say (not a probe body)."""
    rank: int | None
    status: int | None = None
    error: str | None = None
    host: str | None = None
    """``info`` and ``backtrace`` bodies say where the rank runs (the ``Rank N (host:pid)``
    header); None elsewhere."""
    pid: int | None = None

    @classmethod
    def from_wire(cls, body: Body | None) -> Envelope:
        b = body or {}
        err = b.get("error")
        ok = b.get("ok")
        return cls(ok=ok if isinstance(ok, bool) else None, rank=as_int(b.get("rank")),
                   status=as_int(b.get("status")),
                   error=None if err is None else str(err), host=as_str(b.get("host")),
                   pid=as_int(b.get("pid")))


# -- reading rules (every from_wire uses these) ------------------------------------------------

def as_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def as_float(value: Any) -> float | None:
    """A JSON number as sent (an int stays an int: to_wire must write back the same bytes)."""
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def as_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def as_bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def as_dicts(value: Any) -> tuple[dict[str, Any], ...]:
    return tuple(v for v in as_list(value) if isinstance(v, dict))


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def as_dict_or_none(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def as_strs(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in as_list(value))


def as_rows(value: Any) -> tuple[list[Any], ...]:
    return tuple(list(r) for r in as_list(value) if isinstance(r, list | tuple))


def as_strs_or_none(value: Any) -> tuple[str, ...] | None:
    return as_strs(value) if isinstance(value, list | tuple) else None


#: A field's declared type (as written: annotations are strings here) -> how it is read.
READERS: dict[str, Callable[[Any], Any]] = {
    "int": as_int, "int | None": as_int,
    "float": as_float, "float | None": as_float,
    "str": as_str, "str | None": as_str,
    "bool": as_bool, "bool | None": as_bool,
    "dict[str, Any]": as_dict, "dict[str, Any] | None": as_dict_or_none,
    "tuple[dict[str, Any], ...]": as_dicts,
    "tuple[dict[str, Any], ...] | None": lambda value: as_dicts(value)
    if isinstance(value, list | tuple) else None,
    "tuple[str, ...]": as_strs, "tuple[str, ...] | None": as_strs_or_none,
    "tuple[list[Any], ...]": as_rows,
    "Any": lambda value: value,
}
