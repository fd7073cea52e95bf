"""Errors the CLI reports, each with the exit code it ends in and what to do about it.

``main()`` is the one place these become output: it prints ``probe: <message>`` and, when there
is one, ``hint: <help_text>`` on stderr, then returns ``exit_code``. Anything that is not a
``ProbeCLIError`` is a bug and keeps its traceback (memray's ``MemrayCommandError`` pattern).

Per-rank failures do not raise: fan-out stores the error on that rank's ``RankResult`` and the
command's exit code says whether the answer is complete.

Exit codes (``probe``'s whole contract with shell scripts)::

    0  EXIT_OK       every targeted rank answered ok
    1  EXIT_FAILURE  nothing usable: no rank answered ok (bad SQL everywhere, none reachable)
    2  EXIT_USAGE    usage error: bad option, bad target, a --rank not in the job (click's own 2)
    3  EXIT_PARTIAL  some ranks failed or stayed silent, others answered; results still printed
    4  EXIT_FINDING  a diagnosis (hang, straggler, doctor) found a problem; the verdict names it

Hierarchy::

    ProbeCLIError (1)
    ├── UsageProblemError (2)       a target, --rank or --hostfile that cannot be used
    ├── NoAgentError                a local PID without an agent socket
    ├── MissingDependencyError      --gather / --format parquet without duckdb / pyarrow
    └── RankError                   something went wrong talking to one agent (has ``url``)
        ├── AgentUnreachableError   connection refused, no route, unknown host
        ├── AgentTimeoutError       no answer within --timeout (a "silent" rank)
        ├── ProtocolError           an answer that is not a probe wire body
        ├── UntrustedAgentError     the address is not shown to be the job's agent (trust.py)
        └── AgentHTTPError          a non-2xx answer; ``status`` and the agent's ``body``
            ├── AuthError (401)     missing or wrong token
            └── ForbiddenError (403) refused by policy (eval off loopback, peer uid)
"""

from __future__ import annotations

from typing import Any

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_PARTIAL = 3
EXIT_FINDING = 4


class ProbeCLIError(Exception):
    """A failure the operator can act on: one-line ``message`` plus ``help_text``.

    Args:
        message: what went wrong, one line, naming the thing (URL, PID, rank) it went wrong on.
        exit_code: what ``main()`` returns after printing; defaults to the class's.
        help_text: what to do next; printed as a ``hint:`` line under the message.
    """

    exit_code = EXIT_FAILURE
    help_text = ""

    def __init__(
        self, message: str, exit_code: int | None = None, help_text: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        if exit_code is not None:
            self.exit_code = exit_code
        if help_text is not None:
            self.help_text = help_text

    def __str__(self) -> str:
        return self.message


class UsageProblemError(ProbeCLIError):
    """The command line names something that cannot be used; nothing was sent."""

    exit_code = EXIT_USAGE


class NoAgentError(ProbeCLIError):
    help_text = "is it running with PROBE=1? see `probe ps`"


class MissingDependencyError(ProbeCLIError):
    help_text = "pip install duckdb pyarrow (only the machine running probe needs them)"


class RankError(ProbeCLIError):
    """One agent could not give an answer. ``reason`` is the short form used in summaries.

    Args:
        url: the agent's address as shown to the operator (``unix:/path`` for sockets).
        reason: a few words for the one-line multi-rank summary ("connection refused").
    """

    def __init__(self, message: str, *, url: str, reason: str, help_text: str | None = None):
        super().__init__(message, help_text=help_text)
        self.url = url
        self.reason = reason


class AgentUnreachableError(RankError):
    help_text = (
        "is the job running with the agent? Start it with PROBE=1 in its environment (or "
        "`probe launch -- CMD`); `probe ps` lists this machine's agents. Agents bind 127.0.0.1 "
        "by default: set PROBE_HOST on the training side to reach one from another host"
    )


class AgentTimeoutError(RankError):
    help_text = (
        "raise --timeout, or check `probe backtrace` (a stuck rank still answers it; a rank "
        "whose GIL is held answers through the out-of-process reader)"
    )


class ProtocolError(RankError):
    help_text = "is that address a probe agent? `probe -t HOST:PORT info` checks"


class UntrustedAgentError(RankError):
    help_text = ("check the address: agents run as the job's owner; `probe ps` lists this "
                 "machine's agents and `probe PID ...` reaches one over its unix socket")


class AgentHTTPError(RankError):
    """The agent answered with an error body (docs/http-api.md, "Error body").

    Args:
        status: the HTTP status.
        body: the decoded error body; eval's carries ``traceback``, ``stdout``, ``stderr``.
    """

    def __init__(
        self, message: str, *, url: str, reason: str, status: int, body: dict[str, Any]
    ) -> None:
        super().__init__(message, url=url, reason=reason)
        self.status = status
        self.body = body


class AuthError(AgentHTTPError):
    help_text = "pass the job's token with --token-file FILE (or --token, PROBE_TOKEN)"


class ForbiddenError(AgentHTTPError):
    help_text = (
        "only the job's owner (same uid, or root) or a holder of its token may reach an agent: "
        "run probe as that user, or pass --token-file"
    )


def http_error_class(status: int) -> type[AgentHTTPError]:
    """The error class for an HTTP status, so callers can ``except AuthError``."""
    return {401: AuthError, 403: ForbiddenError}.get(status, AgentHTTPError)
