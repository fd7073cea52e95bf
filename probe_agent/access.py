"""Who may reach an agent: one rule for every public socket. Stdlib only.

The agent's own server (``serving/server.py``, ``serving/app.py``, when no watchdog runs) and
the watchdog's proxy (``watchdog/proxy.py``, another process) both decide through
``Policy.check``, so the proxy can never let through what the agent would refuse.

The rule, in order:

1. ``GET /v1/health`` is open to anyone who can connect (liveness checks, load balancers), and
   answers a token-proof challenge (``proof``) so that a client can check an agent before it
   sends it a secret.
2. A TCP request whose ``Host`` header names something other than an IP address or a name of
   this machine is refused (DNS rebinding: a web page steered to 127.0.0.1 sends its own name),
   and so is a browser's cross-origin request (an ``Origin`` that is not the ``Host``).
3. The job's owner passes: a unix-socket peer (SO_PEERCRED) or a TCP peer on this machine (the
   owner of the client's socket, asked of the kernel: peers.py) whose uid is ours or root's.
4. Anyone else needs the job's token (``Authorization: Bearer``); a wrong token is refused even
   for the owner, so that a typo never goes unnoticed.

Refusals carry a one-line reason that says what to do; callers count and audit them.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import socket
from dataclasses import dataclass, field
from typing import Any

from probe_protocol import routes
from probe_protocol.peers import Peer
from probe_protocol.tokens import proof


@dataclass(frozen=True, slots=True)
class Refusal:
    status: int
    message: str
    #: Short words for the audit row and counters: 'host', 'origin', 'uid', 'token'.
    reason: str
    headers: tuple[tuple[str, str], ...] = ()




def token_file_problem(path: str) -> str | None:
    """Why a token file must not be used (readable by group or others), or None."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None  # the open that follows says what is wrong
    if mode & 0o077:
        return (f"token file {path} is readable by other users (mode {mode & 0o777:o}); "
                f"run: chmod 600 {path}")
    return None


def _host_name(host_header: str) -> str:
    h = host_header.strip().lower()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h[1:]
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name.split("%", 1)[0])
    except ValueError:
        return False
    return True


@dataclass(slots=True)
class Policy:
    """The access rule of one agent (see the module docstring).

    Args:
        owner_uid: the job's uid; root is always an owner too.
        token: the job's token, or None (then only the owner gets past health).
        host_names: names of this machine a Host header may carry besides IP addresses
            (hostname, FQDN, PROBE_ADVERTISE_HOST, PROBE_ALLOWED_HOSTS).
    """

    owner_uid: int
    token: str | None
    host_names: frozenset[str] = field(default_factory=frozenset)
    refused: int = 0

    @classmethod
    def for_agent(cls, token: str | None, extra_hosts: list[str] | tuple[str, ...] = ()) -> Policy:
        # Not getfqdn(): a reverse lookup can hang for seconds where DNS is broken, and this
        # runs in the training process's start-up. Other names go in PROBE_ALLOWED_HOSTS.
        names = {"localhost", "localhost.localdomain", socket.gethostname().lower()}
        names.update(h.strip().lower() for h in extra_hosts if h and h.strip())
        return cls(owner_uid=os.getuid(), token=token, host_names=frozenset(names))

    @property
    def mode(self) -> str:
        return "same-user + token" if self.token else "same-user"

    def is_owner(self, peer: Peer) -> bool:
        return peer.kind in ("unix", "local") and peer.uid in (self.owner_uid, 0)

    def check(self, peer: Peer, method: str, path: str, header: dict[str, str]) -> Refusal | None:
        """None when the request may go on; else why not. ``header`` maps lower-case names."""
        if method in ("GET", "HEAD") and path == routes.HEALTH.path:
            return None
        if peer.kind != "unix":
            host = header.get("host")
            if host is not None:
                name = _host_name(host)
                if not _is_ip(name) and name not in self.host_names:
                    return self._refuse(403, "host", (
                        f"Host {host!r} is not an address of this agent (DNS-rebinding "
                        "protection); connect by IP address, or add the name to "
                        "PROBE_ALLOWED_HOSTS on the training side"))
            origin = header.get("origin")
            if origin is not None and origin.split("://", 1)[-1].lower() != (host or "").lower():
                return self._refuse(403, "origin", (
                    f"cross-origin request from {origin!r} refused: agents answer the probe CLI "
                    "and `probe ui`, not web pages"))
        sent = header.get("authorization")
        if sent is not None and self.token is not None:
            # Constant time: the comparison must not leak how much of the token matched.
            if hmac.compare_digest(sent.encode(), f"Bearer {self.token}".encode()):
                return None
            return self._refuse(401, "token", "wrong token: pass the job's token with "
                                "--token-file FILE (or --token, PROBE_TOKEN)",
                                (("WWW-Authenticate", "Bearer"),))
        if self.is_owner(peer):
            return None
        if peer.kind == "local":
            who = f"uid {peer.uid}" if peer.uid is not None else "a process that closed its socket"
            if self.token is not None:
                return self._refuse(401, "token", (
                    f"missing token: {who} is not this job's owner (uid {self.owner_uid}); pass "
                    "the job's token with --token-file FILE (or --token, PROBE_TOKEN)"),
                    (("WWW-Authenticate", "Bearer"),))
            return self._refuse(403, "uid", (
                f"{who} is not this job's owner (uid {self.owner_uid}): run probe as uid "
                f"{self.owner_uid} or root (this job has no token, so only its owner can)"))
        if peer.kind == "unix":
            return self._refuse(403, "uid", (
                f"uid {peer.uid} may not use this agent's socket; run probe as uid "
                f"{self.owner_uid} or root"))
        if self.token is None:
            return self._refuse(403, "token", (
                "this agent has no token and serves only its owner on this machine; set "
                "PROBE_TOKEN_FILE in the job's environment to reach it from other hosts"))
        return self._refuse(401, "token", "missing token: pass the job's token with "
                            "--token-file FILE (or --token, PROBE_TOKEN)",
                            (("WWW-Authenticate", "Bearer"),))

    def _refuse(self, status: int, reason: str, message: str,
                headers: tuple[tuple[str, str], ...] = ()) -> Refusal:
        self.refused += 1
        return Refusal(status, message, reason, headers)

    def health_extra(self, query: dict[str, list[str]] | dict[str, str],
                     server: tuple[str, int] | None) -> dict[str, str]:
        """The token proof for ``GET /v1/health?challenge=NONCE`` (empty without a token).

        Args:
            server: the address the client's connection reached (this side of the accepted
                socket, not the listener's wildcard): the proof names it, so a relay from
                another node's address fails (probe_protocol/tokens.py).
        """
        raw = query.get("challenge")
        nonce = raw[-1] if isinstance(raw, list) else raw
        if not nonce or self.token is None or not server or len(nonce) > 128:
            return {}
        return {"proof": proof(self.token, nonce, str(server[0]), int(server[1]))}


#: Open connections each class of peer may hold: a flood from another uid or host
#: cannot take the owner's share, and a half-open socket is dropped after REQUEST_TIMEOUT_S.
#: The owner's TCP and unix connections are two classes, so that `probe PID` still answers
#: when the owner's own dashboards fill the TCP share.
OWNER_CONNECTIONS = 512
PER_UID_CONNECTIONS = 32
PER_REMOTE_CONNECTIONS = 64
REMOTE_CONNECTIONS = 256
#: Beyond a full owner class, this many more connections are let in for what an on-call
#: engineer needs first: health and backtrace. Anything else on them gets the JSON 503.
OWNER_RESERVE = 32
RESERVED_ROUTES = frozenset({routes.HEALTH.path, routes.BACKTRACE.path})
#: A request's head and body must arrive within this (slowloris); a keep-alive connection
#: waits longer between requests, but only the owner's.
REQUEST_TIMEOUT_S = 10.0
#: After a refusal, how long a server reads (and drops) what the client still sends before it
#: closes: a close with unread input is a TCP reset, which can destroy the answer in flight.
LINGER_S = 1.0
RESERVE = "reserve"


class ConnectionLimits:
    """Counts open connections per class of peer. Used from one event loop: no lock."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.open: dict[str, int] = {}
        self.turned_away = 0

    def _keys(self, peer: Peer) -> list[tuple[str, int]]:
        if self.policy.is_owner(peer):
            return [("owner-unix" if peer.kind == "unix" else "owner", OWNER_CONNECTIONS)]
        if peer.kind in ("local", "unix"):
            return [(f"uid:{peer.uid}", PER_UID_CONNECTIONS)]
        ip = peer.address.rsplit(":", 1)[0]
        return [("remote", REMOTE_CONNECTIONS), (f"ip:{ip}", PER_REMOTE_CONNECTIONS)]

    def admit(self, peer: Peer) -> list[str] | None:
        """The keys to release later, or None when this peer's class is full. A key list that
        contains ``RESERVE`` is a reserve connection: health and backtrace only."""
        keys = self._keys(peer)
        if any(self.open.get(k, 0) >= cap for k, cap in keys):
            if not self.policy.is_owner(peer) or self.open.get(RESERVE, 0) >= OWNER_RESERVE:
                self.turned_away += 1
                return None
            keys = [(RESERVE, OWNER_RESERVE)]
        for k, _ in keys:
            self.open[k] = self.open.get(k, 0) + 1
        return [k for k, _ in keys]

    def release(self, keys: list[str] | None) -> None:
        for k in keys or ():
            left = self.open.get(k, 0) - 1
            if left > 0:
                self.open[k] = left
            else:
                self.open.pop(k, None)


def reserve_refusal(keys: list[str] | None, method: str, path: str) -> str | None:
    """Why a request on a reserve connection is refused (None when it may go on)."""
    if keys is None or RESERVE not in keys or (method == "GET" and path in RESERVED_ROUTES):
        return None
    return ("too many open connections of yours; this one is kept for health and backtrace: "
            "close idle connections and retry")


def overload_message(peer: Peer) -> str:
    return (f"too many open connections from {peer.label()}; close idle ones and retry "
            "(the job's owner keeps a share of its own)")


def header_map(pairs: list[tuple[bytes, bytes]] | list[tuple[str, str]]) -> dict[str, str]:
    """Request headers as lower-case name -> value (the last one wins)."""
    out: dict[str, str] = {}
    for k, v in pairs:
        name = k.decode("latin-1") if isinstance(k, bytes) else k
        out[name.lower()] = v.decode("latin-1") if isinstance(v, bytes) else v
    return out


class Gate:
    """The agent server's side of the rule: the policy and the connection limits. The server's
    protocol puts each connection's Peer and limit keys into the ASGI scope (``SCOPE_PEER``,
    ``SCOPE_KEYS``), where serving/app.py's AdmissionMiddleware reads them per request."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.limits = ConnectionLimits(policy)

    def peer_of(self, scope: dict[str, Any]) -> Peer:
        peer = scope.get(SCOPE_PEER)
        if peer is not None:
            return peer
        client = scope.get("client")
        if not client:
            # A unix socket: the server refused any peer that is not the owner when it
            # accepted the connection (SO_PEERCRED), and the watchdog forwards only what the
            # same rule let through.
            return Peer("unix", self.policy.owner_uid, "unix")
        # No uid read for this connection (uvicorn's h11 fallback has no hook): fail closed,
        # as a peer from elsewhere.
        return Peer("remote", None, f"{client[0]}:{client[1]}")


SCOPE_PEER = "probe.peer"
SCOPE_KEYS = "probe.limit_keys"


class RefusalLog:
    """Refused requests, counted, with one audit row each up to ``burst`` rows per ``window_s``
    seconds: a flood of refused requests must not grow the (never trimmed) audit table or take
    the writer's time. Rows beyond that are counted in ``unlogged``.

    Args:
        write: ``write(client, what, reason, message)`` appends one audit row.
    """

    def __init__(self, write: Any, burst: int = 20, window_s: float = 10.0) -> None:
        self.write = write
        self.burst = burst
        self.window_s = window_s
        self.count = 0
        self.unlogged = 0
        self.by_reason: dict[str, int] = {}
        self._window_start = 0.0
        self._in_window = 0
        #: Ids of the watchdog's reports already applied, newest last (see ``apply_report``).
        self._reports: dict[str, None] = {}

    def apply_report(self, report_id: str, refused: list[tuple[str, str, str, str]],
                     unlisted: int, now: float) -> bool:
        """Record a report of the watchdog's refusals ``(client, what, reason, message)``
        once: the watchdog sends a report again, unchanged, until it is answered, and one sent
        during a GIL hold is delivered, then answered too late (watchdog/refusal_report.py).
        False when that id was applied already."""
        if report_id and report_id in self._reports:
            return False
        if report_id:
            self._reports[report_id] = None
        while len(self._reports) > 256:  # ids of reports long acknowledged
            del self._reports[next(iter(self._reports))]
        for client, what, reason, message in refused:
            self.record(client, what, reason, message, now)
        self.count += unlisted
        self.unlogged += unlisted
        return True

    def record(self, client: str, what: str, reason: str, message: str, now: float) -> None:
        self.count += 1
        self.by_reason[reason] = self.by_reason.get(reason, 0) + 1
        if now - self._window_start > self.window_s:
            self._window_start, self._in_window = now, 0
        if self._in_window >= self.burst:
            self.unlogged += 1
            return
        self._in_window += 1
        self.write(client, what, reason, message)

    def describe(self) -> dict[str, Any]:
        return {"refused": self.count, "by_reason": dict(self.by_reason),
                "unlogged": self.unlogged}
