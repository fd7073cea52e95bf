"""What the commands add when their target is a dead job's copy (transport/postmortem.py reads
it): which copy a command targets, and the steps each rank recorded before it went."""

from __future__ import annotations

from typing import Any

from probe_protocol.query import QueryBody

from ..errors import RankError
from ..transport.postmortem import JobCopy, PostmortemClient, find_job


def session_job(session: Any) -> JobCopy | None:
    """The post-mortem copy a command targets (``-t DIR``), or None for live ranks."""
    ep = session.endpoints[0] if session.endpoints else None
    return find_job(ep.postmortem) if ep is not None and ep.postmortem else None


def last_steps_lines(job: JobCopy, ranks: list[int], n: int = 5) -> list[str]:
    """The last ``n`` steps each of ``ranks`` recorded before it went: what led up to it."""
    out = []
    for rank in ranks:
        client = PostmortemClient(job.ranks[rank])
        try:
            body = QueryBody.from_wire(client.query(
                f"SELECT step, duration FROM python.steps ORDER BY step DESC LIMIT {int(n)}"))
            rows = body.records()[::-1]
        except RankError:
            rows = []
        finally:
            client.close()
        steps = ", ".join(f"{r['step']} ({(r['duration'] or 0) * 1e3:.0f} ms)" for r in rows)
        out.append(f"  rank {rank}'s last steps: {steps}" if rows else
                   f"  rank {rank} recorded no steps")
    return out
