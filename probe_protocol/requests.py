"""How a request body is declared, checked, written and described: one way for every route.

A request is a frozen dataclass whose fields carry a ``Rule`` (``arg(...)``): its JSON type,
bounds, pattern and description. ``Request.from_wire`` checks a parsed JSON body against the
rules and the class's own ``check`` and raises ``RequestError`` (HTTP 422) listing every
problem as ``field: message``; ``to_wire`` writes what the CLI sends; ``json_schema`` is the
OpenAPI schema the agent serves (schemathesis fuzzes the agent against it). The agent reads
every body through ``from_wire`` (serving/routes/bodies.py), and the CLI builds every body
with the same class: the two cannot drift.

Checks are strict where pydantic's lax mode was not: ``true`` is not a number and ``"0.5"`` is
not one either (``{"set": true}`` once set every LR to 1.0).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, TypeVar

Body = Mapping[str, Any]
R = TypeVar("R", bound="Request")
#: A job id the CLI chooses (the same on every rank): an eval's, an action's, a flame's.
ID_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"


class RequestError(ValueError):
    """A body that does not fit its request class: ``problems`` is ``[(field, message)]``."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{k}: {m}" if k else m for k, m in problems))


@dataclass(frozen=True, slots=True)
class Rule:
    """``kind``: int, number, bool, str, object (a JSON object), ints (a list of ints),
    objects (a list of objects), any."""

    kind: str
    description: str = ""
    ge: float | None = None
    gt: float | None = None
    max_length: int | None = None
    pattern: str | None = None
    choices: tuple[str, ...] = ()
    required: bool = False


def arg(kind: str, default: Any = None, *, description: str = "", ge: float | None = None,
        gt: float | None = None, max_length: int | None = None, pattern: str | None = None,
        choices: tuple[str, ...] = (), required: bool = False) -> Any:
    """A request field and its rule (``required`` fields have no default)."""
    rule = Rule(kind, description, ge, gt, max_length, pattern, choices, required)
    if required:
        return field(metadata={"rule": rule})
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"rule": rule})
    return field(default=default, metadata={"rule": rule})


def _number(v: Any) -> str | None:
    if isinstance(v, (bool, str)):
        return f"Value error, give a JSON number, not {type(v).__name__} {v!r}"
    if not isinstance(v, (int, float)):
        return "Input should be a valid number"
    if isinstance(v, float) and not math.isfinite(v):
        return f"Value error, give a finite number, not {v!r}"
    return None


def _problem(rule: Rule, v: Any) -> str | None:
    """What is wrong with ``v`` under ``rule`` (pydantic's wording where there is one)."""
    k = rule.kind
    if k in ("int", "number"):
        bad = _number(v)
        if bad:
            return bad
        if k == "int" and isinstance(v, float) and not v.is_integer():
            return "Input should be a valid integer, got a number with a fractional part"
        if rule.ge is not None and v < rule.ge:
            return f"Input should be greater than or equal to {rule.ge:g}"
        if rule.gt is not None and v <= rule.gt:
            return f"Input should be greater than {rule.gt:g}"
    elif k == "bool":
        if not isinstance(v, bool):
            return "Input should be a valid boolean"
    elif k == "str":
        if not isinstance(v, str):
            return "Input should be a valid string"
        if rule.max_length is not None and len(v) > rule.max_length:
            return f"String should have at most {rule.max_length} characters"
        if rule.pattern is not None and not re.fullmatch(rule.pattern, v):
            return f"String should match pattern '{rule.pattern}'"
        if rule.choices and v not in rule.choices:
            return "Input should be " + ", ".join(repr(c) for c in rule.choices)
    elif k == "object":
        if not isinstance(v, dict):
            return "Input should be a valid dictionary"
    elif k == "ints":
        if not isinstance(v, list) or any(_number(x) or not float(x).is_integer() for x in v):
            return "Input should be a list of whole JSON numbers"
    elif k == "objects":
        if not isinstance(v, list) or not all(isinstance(x, dict) for x in v):
            return "Input should be a list of objects"
        if rule.max_length is not None and len(v) > rule.max_length:
            return f"List should have at most {rule.max_length} items"
    return None


def _plan(cls: type) -> list[tuple[str, Rule, Any]]:
    out = []
    for f in fields(cls):
        rule = f.metadata.get("rule")
        if rule is None:
            continue
        default = (f.default if f.default is not MISSING else
                   f.default_factory() if f.default_factory is not MISSING else MISSING)
        out.append((f.name, rule, default))
    return out


class Request:
    """Mixin for request dataclasses. ``EXTRA``: the field (a dict) that keeps keys no rule
    names, or None to ignore them (a newer CLI's keys reach an older agent harmlessly)."""

    __slots__ = ()
    EXTRA: ClassVar[str | None] = None
    #: old spelling -> new, read when only the old one is sent (an older CLI)
    RENAMED: ClassVar[Mapping[str, str]] = {}

    def check(self) -> str | None:
        """A problem across fields (HTTP 422), or None."""
        return None

    @classmethod
    def from_wire(cls: type[R], body: Any) -> R:
        """Check ``body`` (a parsed JSON value) and build the request.

        Raises:
            RequestError: every problem found, each as ``(field, message)``.
        """
        if not isinstance(body, dict):
            raise RequestError([("", "Input should be a valid dictionary (a JSON object)")])
        body = dict(body)
        for old, new in cls.RENAMED.items():
            if old in body and new not in body:
                body[new] = body.pop(old)
        problems, kw = [], {}
        names = set()
        for name, rule, default in _plan(cls):
            names.add(name)
            v = body.get(name)
            if v is None:
                if rule.required:
                    problems.append((name, "Field required"))
                elif default is not MISSING:
                    kw[name] = default
                continue
            bad = _problem(rule, v)
            if bad:
                problems.append((name, bad))
            else:
                kw[name] = (float(v) if rule.kind == "number" else
                            int(v) if rule.kind == "int" else
                            [int(x) for x in v] if rule.kind == "ints" else
                            tuple(v) if rule.kind == "objects" else v)
        if cls.EXTRA is not None:
            kw[cls.EXTRA] = {k: v for k, v in body.items() if k not in names}
        if problems:
            raise RequestError(problems)
        made = cls(**kw)
        bad = made.check()
        if bad:
            raise RequestError([("", f"Value error, {bad}")])
        return made

    def to_wire(self) -> dict[str, Any]:
        """The body the CLI sends: fields left at None are left out; extra keys go flat."""
        out: dict[str, Any] = {}
        for name, _, _ in _plan(type(self)):
            v = getattr(self, name)
            if v is not None:
                out[name] = list(v) if isinstance(v, tuple) else v
        if self.EXTRA is not None:
            out.update(getattr(self, self.EXTRA))
        return out

    def fields(self) -> dict[str, Any]:
        """Every field by name, extra keys flat: what an action kind reads."""
        out = {name: getattr(self, name) for name, _, _ in _plan(type(self))}
        if self.EXTRA is not None:
            out.update(getattr(self, self.EXTRA))
        return out

    @classmethod
    def json_schema(cls) -> dict[str, Any]:
        """The JSON Schema of the body, for the OpenAPI spec."""
        props: dict[str, Any] = {}
        required = []
        for name, rule, default in _plan(cls):
            props[name] = _schema(rule, default)
            if rule.required:
                required.append(name)
        out: dict[str, Any] = {"type": "object", "title": cls.__name__, "properties": props}
        if required:
            out["required"] = required
        return out


_JSON_TYPES = {"int": "integer", "number": "number", "bool": "boolean", "str": "string",
               "object": "object"}


def _schema(rule: Rule, default: Any) -> dict[str, Any]:
    s: dict[str, Any]
    if rule.kind == "ints":
        s = {"type": "array", "items": {"type": "integer"}}
    elif rule.kind == "objects":
        s = {"type": "array", "items": {"type": "object"}}
        if rule.max_length is not None:
            s["maxItems"] = rule.max_length
    elif rule.kind == "any":
        s = {}
    else:
        s = {"type": _JSON_TYPES[rule.kind]}
    if not rule.required and default is None:
        s = {"anyOf": [s, {"type": "null"}]}
    for key, v in (("minimum", rule.ge), ("exclusiveMinimum", rule.gt),
                   ("maxLength", rule.max_length if rule.kind == "str" else None),
                   ("pattern", rule.pattern)):
        if v is not None:
            s[key] = v
    if rule.choices:
        s["enum"] = list(rule.choices)
    if rule.description:
        s["description"] = rule.description
    if default is not None and default is not MISSING and not rule.required:
        s["default"] = default
    return s
