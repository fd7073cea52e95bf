"""The format version of what an agent sends and a post-mortem copy holds (bodies, tables, the
copy's layout), as memray's file header carries one: ``/v1/info`` and every copy's
``meta.json`` say ``format``, and the CLI compares it with its own instead of guessing from an
error's text.

1: agents and copies from before the field (they send none); 2: request bodies are
probe_protocol classes, look-ahead is ``ahead`` on the wire. Bump it when a change would make
one side misread the other, and say what changed here.
"""

from __future__ import annotations

from typing import Any

FORMAT = 2
#: What an agent or copy that sends no ``format`` speaks.
BEFORE_FIELD = 1


def format_of(value: Any) -> int:
    """The format a body or ``meta.json`` says (``BEFORE_FIELD`` when it says none)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else BEFORE_FIELD


def disagreement(theirs: Any, what: str) -> str | None:
    """One line saying that ``what`` (``"rank 3's agent"``, ``"this copy"``) speaks another
    format than this CLI and what to do; None when they agree."""
    f = format_of(theirs)
    if f == FORMAT:
        return None
    if f < FORMAT:
        return (f"{what} speaks probe format {f}, this CLI format {FORMAT}: it is older, and "
                "what it lacks is reported as not recorded; upgrade probe in the training "
                "environment, or use a CLI of its version")
    return (f"{what} speaks probe format {f}, this CLI format {FORMAT}: the CLI is older; "
            "upgrade it (pip install -U probe-torch)")
