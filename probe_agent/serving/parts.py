"""What the HTTP side uses of its agent, as a protocol: the routes, the app and the admission
middleware are typed against ``AgentParts``, never against agent.py, which sits above serving
and wires it (``create_app(agent)``). agent.py's ``Agent`` is the one implementation.

Every name here is something a route reads or calls; a route that needs more adds it here, so
the list stays the whole contract between the agent and its HTTP side.
"""

from __future__ import annotations

from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from probe_protocol.bodies import InfoBody, RankEntry

    from ..access import Gate, Refusal, RefusalLog
    from ..actions.queue import ActionQueue
    from ..clock import StepClock
    from ..collectors.registry import Collectors
    from ..config import AgentConfig
    from ..evaluator import Evaluator
    from ..profiling.sessions import Profiling
    from ..ranks import Identity
    from ..store.store import Store


class AgentParts(Protocol):
    rank: int
    config: AgentConfig
    identity: Identity
    store: Store
    stepclock: StepClock
    actions: ActionQueue
    evaluator: Evaluator
    collectors: Collectors
    profiling: Profiling
    gate: Gate
    refusals: RefusalLog
    # Separate pools so a slow query never starves eval or backtrace, and vice versa. Read-only
    # here (properties): the agent's are its own Executor subclass (serving/idle_pool.py).
    @property
    def query_pool(self) -> Executor: ...

    @property
    def sql_pool(self) -> Executor:
        """Operators' SQL, on threads that yield the CPU to training (cpu_priority.py)."""
        ...

    @property
    def canned_pool(self) -> Executor:
        """The canned queries, at nice 10: what the CLI's verdicts wait on (cpu_priority.py)."""
        ...

    @property
    def eval_pool(self) -> Executor: ...

    #: Set by create_app: the requests' CPU budget (budget.py).
    serve_budget: Any
    tcp_port: int | None

    def info(self) -> InfoBody:
        """``/v1/info``: who and where this rank is."""

    def known_ranks(self) -> list[RankEntry]:
        """Every rank this agent knows, itself included, by rank."""

    def run_eval(self, code: str, client: str, eval_id: str | None = None) -> Any:
        """Run operator code (``/v1/eval``) as eval ``eval_id``; audited; raises EvalError on
        failure."""

    def audit(self, client: str, code: str, outcome: str, error: str | None, ms: float,
              **action: Any) -> None:
        """One row of the audit table."""

    def audit_refusal(self, client: str, method: str, path: str, refusal: Refusal) -> None:
        """Count a refused request, and audit it within the refusal log's burst."""
