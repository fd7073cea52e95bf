"""Grouping ranks that gave the same answer, and writing rank sets compactly (``0–6,8–15``).

Pure functions; stdlib only.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)

EN_DASH = "–"


def compact_ranges(ranks: Iterable[int]) -> str:
    """``[0,1,2,3,5,7,8]`` -> ``"0–3,5,7,8"``.

    Runs of three or more become ``a–b`` with an en dash (a rank list is not a subtraction);
    pairs stay as ``7,8``, which reads faster than ``7–8``.
    """
    nums = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{nums[i]}{EN_DASH}{nums[j]}")
        else:
            parts.extend(str(n) for n in nums[i : j + 1])
        i = j + 1
    return ",".join(parts)


def rank_label(ranks: Iterable[int | None]) -> str:
    """``"rank 7"``, ``"ranks 0–6,8"``; a rank discovery could not tell shows as ``?``."""
    ranks = list(ranks)
    known = sorted({r for r in ranks if r is not None})
    unknown = None in ranks
    text = compact_ranges(known)
    if unknown:
        text = f"{text},?" if text else "?"
    many = len(known) + (1 if unknown else 0) > 1
    return f"{'ranks' if many else 'rank'} {text}"


@dataclass(frozen=True, slots=True)
class Group(Generic[T]):
    """Members that share one key; ``members`` keep their input order."""

    key: Hashable
    members: tuple[T, ...]

    @property
    def first(self) -> T:
        return self.members[0]


def group_by(items: Iterable[T], key: Callable[[T], K]) -> list[Group[T]]:
    """Group ``items`` by ``key``; groups in order of first appearance."""
    groups: dict[K, list[T]] = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return [Group(k, tuple(v)) for k, v in groups.items()]


def outliers_first(groups: list[Group[T]], rank: Callable[[T], int | None]) -> list[Group[T]]:
    """Smallest groups first (the odd ranks out are what an operator looks for), ties by the
    lowest rank in the group."""

    def order(g: Group[T]) -> tuple[int, int]:
        ranks = [r for r in (rank(m) for m in g.members) if r is not None]
        return (len(g.members), min(ranks) if ranks else 1 << 62)

    return sorted(groups, key=order)
