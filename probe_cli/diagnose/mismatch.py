"""Collective mismatches: ranks that met in one collective with different calls, classified by
kind, from every rank's ``python.collectives`` rows alone (pure; no extra collective, unlike
``TORCH_DISTRIBUTED_DEBUG=DETAIL``'s fingerprint check, and live or from a post-mortem copy).

The Flight Recorder numbers the collectives of a process group identically on every member, so
the calls that met are the rows with the same (group, seq). A mismatch is one such (group, seq)
where the members' calls differ, looked for where the job went wrong: a seq some rank still
waits in, or whose call failed (a backend that aborts instead of hanging, as gloo does on a
size mismatch, leaves a ``failed`` row on the survivor and a ``pending`` one in the aborted
rank's copy). Kinds, the first that applies:

- ``group``: the members disagree on who is in the group (``group_ranks`` differ);
- ``order``: two calls each rank makes, in a different order (rank A's call at seq N is rank
  B's at N+1 and the other way round, seen once gloo let a pair through);
- ``sequence``: one side runs one collective more (its calls from seq N on are the other side's
  from N-1 on: an extra or a skipped collective gloo happened to match);
- ``op``: different collectives; ``sizes``: the same op with different shapes; ``dtype``: the
  same shapes in different dtypes.

Which side is the odd one out: the smaller side when the sides differ in size; with a tie (two
ranks), the side whose call (op, sizes, dtype, call site) no rank made at an earlier seq, when
exactly one side's is new. Otherwise the verdict says it cannot tell.

Sizes are compared only for collectives whose members must pass equal shapes (an
``all_to_all``'s splits or a ``gather``'s root legitimately differ).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from ..group import rank_label

#: Ops whose every member passes the same shapes and dtype.
SAME_SHAPES = frozenset({"all_reduce", "all_reduce_coalesced", "broadcast", "reduce",
                         "all_gather", "reduce_scatter", "barrier", "allreduce"})


@dataclass(frozen=True, slots=True)
class Side:
    """The ranks that made one call: its op, shapes (JSON text), dtype and call site."""

    ranks: tuple[int, ...]
    op: str
    shapes: str
    dtype: str | None
    callsite: str | None
    group_ranks: tuple[int, ...] | None
    state: str

    def call(self) -> str:
        return f"{self.op} {_sizes(self.shapes)}{' ' + self.dtype if self.dtype else ''}"

    def to_json(self) -> dict[str, Any]:
        return {"ranks": list(self.ranks), "op": self.op, "shapes": _shapes(self.shapes),
                "dtype": self.dtype, "callsite": self.callsite,
                "group_ranks": list(self.group_ranks) if self.group_ranks else None,
                "state": self.state}


@dataclass(slots=True)
class Mismatch:
    kind: str  # group | order | sequence | op | sizes | dtype
    pg: str
    seq: int
    sides: list[Side]
    odd: int | None  # index into sides, or None when it cannot be told
    why_odd: str
    extra: list[str] = field(default_factory=list)

    @property
    def culprits(self) -> list[int]:
        if self.odd is not None:
            return list(self.sides[self.odd].ranks)
        return sorted(r for s in self.sides for r in s.ranks)

    def headline(self) -> str:
        kind = {"group": "different group membership", "order": "different order",
                "sequence": "out of step", "op": "different collectives",
                "sizes": "different sizes", "dtype": "different dtypes"}[self.kind]
        parts = [f"{rank_label(list(s.ranks))} called {_what(s, self.kind)} at "
                 f"{short_site(s.callsite)}" for s in self._ordered()]
        who = (f"; {rank_label(list(self.sides[self.odd].ranks))} "
               f"{'is' if len(self.sides[self.odd].ranks) == 1 else 'are'} the odd one out"
               if self.odd is not None else "; which side is odd cannot be told")
        return f"COLLECTIVE MISMATCH ({kind}) at #{self.seq} of group {self.pg}: " + \
            " where ".join(parts) + who

    def _ordered(self) -> list[Side]:
        if self.odd is None:
            return self.sides
        return [self.sides[self.odd]] + [s for i, s in enumerate(self.sides) if i != self.odd]

    def details(self) -> list[str]:
        lines = [f"{rank_label(list(s.ranks))}: {s.call()} #{self.seq} ({s.state}) at "
                 f"{s.callsite or '?'}"
                 + (f", group ranks {list(s.group_ranks)}" if self.kind == "group" and
                    s.group_ranks else "") for s in self._ordered()]
        lines.append(f"odd one out: {self.why_odd}")
        return lines + self.extra

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "pg": self.pg, "seq": self.seq,
                "sides": [s.to_json() for s in self.sides], "odd_ranks":
                list(self.sides[self.odd].ranks) if self.odd is not None else None,
                "why_odd": self.why_odd}


def short_site(site: str | None) -> str:
    if not site:
        return "?"
    path, _, rest = site.partition(":")
    return f"{os.path.basename(path)}:{rest}"


def _shapes(text: Any) -> Any:
    try:
        return json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return text


def _sizes(text: Any) -> str:
    shapes = _shapes(text) or []
    if not isinstance(shapes, list):
        return str(shapes)
    return ", ".join(("[" + ", ".join(map(str, s)) + "]" if s else "[] (a scalar)")
                     if isinstance(s, list) else str(s) for s in shapes) or "[]"


def _what(s: Side, kind: str) -> str:
    if kind == "sizes":
        return f"{s.op} with {_sizes(s.shapes)}"
    if kind == "dtype":
        return f"{s.op} in {s.dtype}"
    if kind == "group":
        return f"{s.op} in group {list(s.group_ranks or ())}"
    return s.call()


def _sig(row: dict[str, Any], with_shapes: bool = True) -> tuple[Any, ...]:
    op = str(row.get("op"))
    shapes = str(row.get("shapes") or "[]") if with_shapes and op in SAME_SHAPES else ""
    return (op, shapes, row.get("dtype") if op in SAME_SHAPES else None)


def _key(row: dict[str, Any]) -> tuple[str, int] | None:
    if row.get("is_p2p") or row.get("seq") is None:
        return None
    try:
        return str(row.get("pg")), int(row["seq"])
    except (TypeError, ValueError):
        return None


def _tables(rows_by_rank: dict[int, tuple[dict[str, Any], ...]]
            ) -> dict[int, dict[tuple[str, int], dict[str, Any]]]:
    out: dict[int, dict[tuple[str, int], dict[str, Any]]] = {}
    for rank, rows in rows_by_rank.items():
        table = out.setdefault(rank, {})
        for row in rows:
            key = _key(row)
            if key is not None:
                table[key] = row
    return out


def find_mismatch(rows_by_rank: dict[int, tuple[dict[str, Any], ...]]) -> Mismatch | None:
    """The first (group, seq) where the ranks that reached it called different things, among
    the seqs some rank waits in or failed at; None when every such meeting agrees."""
    tables = _tables(rows_by_rank)
    troubled = sorted({k for t in tables.values() for k, r in t.items()
                       if r.get("state") in ("pending", "failed")}, key=lambda k: (k[1], k[0]))
    for key in troubled:
        here = {r: t[key] for r, t in tables.items() if key in t}
        if len(here) < 2:
            continue
        m = _classify(key, here, tables)
        if m is not None:
            return m
    return None


def _side_of(ranks: list[int], row: dict[str, Any]) -> Side:
    gr = row.get("group_ranks")
    return Side(tuple(sorted(ranks)), str(row.get("op")), str(row.get("shapes") or "[]"),
                row.get("dtype"), row.get("callsite"), tuple(gr) if gr else None,
                str(row.get("state")))


def _classify(key: tuple[str, int], here: dict[int, dict[str, Any]],
              tables: dict[int, dict[tuple[str, int], dict[str, Any]]]) -> Mismatch | None:
    groups = {tuple(r.get("group_ranks") or ()) for r in here.values()}
    split: Any
    if len(groups - {()}) > 1:
        kind, split = "group", lambda r: tuple(r.get("group_ranks") or ())
    else:
        ops = {str(r.get("op")) for r in here.values()}
        if len(ops) > 1:
            kind, split = "op", lambda r: str(r.get("op"))
        elif len({_sig(r) for r in here.values()}) > 1:
            same_shapes = len({_sig(r)[:2] for r in here.values()}) == 1
            kind, split = ("dtype" if same_shapes else "sizes"), _sig
        else:
            return None
    by: dict[Any, list[int]] = {}
    for rank, row in sorted(here.items()):
        by.setdefault(split(row), []).append(rank)
    sides = [_side_of(ranks, here[ranks[0]]) for ranks in by.values()]
    extra: list[str] = []
    shifted = _shift(key, sides, tables)
    if shifted is not None:
        kind, extra = shifted
    if kind == "op" and len(sides) == 2:
        extra += _same_function(sides)
    odd, why = _odd(key, sides, here, tables)
    return Mismatch(kind, key[0], key[1], sides, odd, why, extra)


def _same_function(sides: list[Side]) -> list[str]:
    """Two different ops at one seq, called from one function at different lines: either the
    ranks make both calls in a different order (an order mismatch, which the tables show only
    once a swapped pair goes through: here the first pair hangs, so nothing says what either
    rank calls next), or one side took another branch. Both readings are said; neither is
    guessed (docs/decisions/diagnosis.md)."""
    where = []
    for s in sides:
        path, _, rest = (s.callsite or "").partition(":")
        line, _, func = rest.partition(" ")
        where.append((path, func, line))
    (p0, f0, l0), (p1, f1, l1) = where
    if not f0 or (p0, f0) != (p1, f1) or l0 == l1:
        return []
    return [f"both calls are in {f0} ({os.path.basename(p0)}:{l0} and :{l1}): if every rank "
            "makes both, they make them in a different order (an order mismatch); if not, one "
            "side took another branch"]


def _shift(key: tuple[str, int], sides: list[Side],
           tables: dict[int, dict[tuple[str, int], dict[str, Any]]]
           ) -> tuple[str, list[str]] | None:
    """``order`` or ``sequence`` when the two sides' neighbouring calls show it."""
    if len(sides) != 2:
        return None
    a, b = (tables[s.ranks[0]] for s in sides)
    pg, seq = key

    def sig(t: dict[tuple[str, int], dict[str, Any]], n: int) -> tuple[Any, ...] | None:
        row = t.get((pg, n))
        return (*_sig(row), row.get("callsite")) if row is not None else None

    a0, b0, a1, b1 = sig(a, seq), sig(b, seq), sig(a, seq + 1), sig(b, seq + 1)
    if a1 is not None and b1 is not None and a0 == b1 and a1 == b0:
        return "order", [f"at #{seq + 1} each side called what the other called at #{seq}"]
    for (x, y), (first, second) in (((a, b), (sides[0], sides[1])),
                                    ((b, a), (sides[1], sides[0]))):
        nxt = sig(x, seq + 1)
        if nxt is not None and nxt == sig(y, seq) and sig(x, seq) != sig(y, seq + 1):
            return "sequence", [f"{rank_label(list(first.ranks))}'s call at #{seq + 1} is "
                                f"{rank_label(list(second.ranks))}'s at #{seq}: "
                                f"{rank_label(list(first.ranks))} ran one collective more"]
    return None


def _odd(key: tuple[str, int], sides: list[Side], here: dict[int, dict[str, Any]],
         tables: dict[int, dict[tuple[str, int], dict[str, Any]]]) -> tuple[int | None, str]:
    sizes = [len(s.ranks) for s in sides]
    if len(sides) >= 2 and sizes.count(min(sizes)) == 1 and min(sizes) < max(sizes):
        i = sizes.index(min(sizes))
        return i, (f"{rank_label(list(sides[i].ranks))} against "
                   f"{sum(sizes) - sizes[i]} ranks making the other call")
    pg, seq = key
    seen: set[tuple[Any, ...]] = set()
    for t in tables.values():
        for (p, n), row in t.items():
            if p == pg and n < seq and row.get("state") == "done":
                seen.add((*_sig(row), row.get("callsite")))
    new = [i for i, s in enumerate(sides)
           if (*_sig(here[s.ranks[0]]), s.callsite) not in seen]
    if len(new) == 1 and len(sides) == 2:
        i = new[0]
        usual = sides[1 - i]
        want = (*_sig(here[usual.ranks[0]]), usual.callsite)
        runs = max(sum(1 for (p, n), row in t.items() if p == pg and n < seq and
                       row.get("state") == "done" and (*_sig(row), row.get("callsite")) == want)
                   for t in tables.values())
        return i, (f"no rank made {rank_label(list(sides[i].ranks))}'s call "
                   f"({sides[i].call()} at {short_site(sides[i].callsite)}) before #{seq}; "
                   f"{rank_label(list(usual.ranks))}'s was made {runs} time"
                   f"{'s' if runs != 1 else ''} before in the rows kept")
    if not seen:
        return None, "no earlier collectives of this group were kept to compare against"
    return None, ("both calls were made before (or neither was): the tables cannot tell "
                  "which side strayed")
