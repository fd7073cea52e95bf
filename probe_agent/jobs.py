"""Jobs: work an agent does in the background for an operator, each with an id to ask about.

Step-boundary actions, profile windows, flame sessions and evals that outlive their request are
all jobs: the same fields (``Job``), the same states (``JobState``), one bounded table per kind
(``JobTable``) with one not-found error, and one long-poll (``JobTable.wait``) behind the same
route shape, ``GET /v1/<kind>s/{id}?wait=S`` and ``DELETE /v1/<kind>s/{id}`` to cancel.

States, in the order a job may pass through them::

    queued -> waiting (ranks agreeing) -> running | recording | sampling -> exporting
           -> ok | done | error | cancelled | skipped          (terminal)

Not every kind uses every state (an eval is running, then ok, error or cancelled). The values
are the strings the wire has always carried, so clients that compare strings keep working.

Stdlib only, at the bottom layer: the actions, profiling and the evaluator build on it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, Generic, Protocol, TypeVar

from .errors import ConflictError, NotFoundError

#: Longest a ``?wait=S`` long-poll holds a request open.
MAX_WAIT_S = 30.0
#: How often a long-poll looks at the job's state (it is a field read, no lock).
POLL_S = 0.02


class JobState(str, Enum):
    QUEUED = "queued"
    WAITING = "waiting"
    RUNNING = "running"
    RECORDING = "recording"
    SAMPLING = "sampling"
    EXPORTING = "exporting"
    OK = "ok"
    DONE = "done"
    ERROR = "error"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"

    def __str__(self) -> str:  # f-strings and logs show the wire value
        return self.value

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({JobState.OK, JobState.DONE, JobState.ERROR, JobState.CANCELLED,
                      JobState.SKIPPED})


@dataclass(kw_only=True)
class Job:
    """What every job carries; a kind adds its own fields (a subclass) and ``to_wire`` adds
    them to the body."""

    id: str
    kind: str
    state: JobState = JobState.QUEUED
    submitted_at: float = field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None
    #: One line for listings; the details are the kind's own fields.
    result: str | None = None
    error: str | None = None

    @property
    def finished(self) -> bool:
        return JobState(self.state).terminal

    def finish(self, state: JobState, error: str | None = None) -> None:
        self.state, self.finished_at = state, time.time()
        if error is not None:
            self.error = error

    def to_wire(self) -> dict[str, Any]:
        """The job as JSON-ready values: every dataclass field not starting with ``_``."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name.startswith("_"):
                continue
            v = getattr(self, f.name)
            out[f.name] = v.value if isinstance(v, Enum) else v
        return out


class Tracked(Protocol):
    """What a table needs of what it holds: a ``Job``, or an object that keeps its own state
    (a profile window, a flame session) and says when it has finished."""

    id: str

    @property
    def finished(self) -> bool: ...


J = TypeVar("J", bound=Tracked)


class JobTable(Generic[J]):
    """One kind's jobs on one rank: unfinished ones are always kept, finished ones up to
    ``keep_finished`` (oldest dropped first).

    Args:
        noun: how errors name a job of this kind ("action", "eval", "profile").
        rank: named in errors (a callable when the rank can change, as after renumbering).
        keep_finished: finished jobs kept for listings and late polls.
        listing: the command that lists them, named in the not-found error.
    """

    def __init__(self, noun: str, rank: int | Callable[[], int], keep_finished: int,
                 listing: str) -> None:
        self.noun, self.keep_finished, self.listing = noun, keep_finished, listing
        self._rank = rank
        self._jobs: OrderedDict[str, J] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def rank(self) -> int:
        return self._rank() if callable(self._rank) else self._rank

    def add(self, job: J) -> J:
        with self._lock:
            if job.id in self._jobs:
                raise ConflictError(f"{self.noun} {job.id} already exists on rank {self.rank}; "
                                    "choose a new id", reason="duplicate")
            self._jobs[job.id] = job
            done = [k for k, j in self._jobs.items() if j.finished]
            for k in done[: max(0, len(done) - self.keep_finished)]:
                del self._jobs[k]
        return job

    def find(self, job_id: str) -> J | None:
        return self._jobs.get(job_id)

    def get(self, job_id: str) -> J:
        job = self._jobs.get(job_id)
        if job is None:
            raise NotFoundError(f"no {self.noun} {job_id} on rank {self.rank}; {self.listing} "
                                "lists them (finished ones are kept for a while only)")
        return job

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs

    def __iter__(self) -> Iterator[J]:
        return iter(list(self._jobs.values()))

    def __len__(self) -> int:
        return len(self._jobs)

    async def wait(self, job_id: str, seconds: float) -> J:
        """The job once it has finished, or after ``seconds`` (at most MAX_WAIT_S) as it is
        then. A not-found is raised at once, before any wait."""
        job = self.get(job_id)
        deadline = time.monotonic() + min(max(seconds, 0.0), MAX_WAIT_S)
        while not job.finished and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
        return job
