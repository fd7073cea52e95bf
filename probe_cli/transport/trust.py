"""Before anything but a health check leaves the CLI: is that address the job's agent? (issue 19)

The ports are predictable (9700 + local rank), so another local user can listen on one first and
wait for an operator's token and code. Each client checks its agent once, before its first
request that is not ``GET /v1/health``:

- a unix socket: the socket file belongs to us or root (the agent's run dir is 0700);
- TCP to this machine: the listening socket's owner in /proc/net/tcp{,6} is us or root. Any
  other owner is refused outright, token or not: the job's agent runs as the job's owner, and a
  squatter could relay a token proof from the real agent on another port;
- TCP to another host: ``https`` verified against ``--cacert`` (a pinned CA), or, when we hold
  a token, the agent proves it holds the same token for this port (``GET /v1/health?challenge``,
  docs/http-api.md) before the token is sent. Without a token there is nothing secret to send.

Discovered ranks (``/v1/ranks``) are checked the same way before they get the token.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
import socket
import struct
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from ..errors import UntrustedAgentError
from .targets import Endpoint

_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


def _trusted_uid(uid: int) -> bool:
    return uid in (os.getuid(), 0)


def listener_uid(ip: str, port: int) -> int | None:
    """The owner of the socket listening on ``ip:port`` (or on a wildcard address at that
    port), from this network namespace's /proc/net tables; None when not found or not Linux."""
    addr = ipaddress.ip_address(ip)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    # /proc prints addresses as 32-bit words in host byte order.
    words = struct.unpack(f"={len(addr.packed) // 4}I", addr.packed)
    want = "".join(f"{w:08X}" for w in words) + f":{port:04X}"
    for table in _TABLES:
        try:
            with open(table, encoding="ascii") as f:
                rows = [line.split() for line in f][1:]
        except OSError:
            continue
        for row in rows:
            # state 0A = LISTEN; inode 0 = no process holds it any more
            if len(row) < 10 or row[3] != "0A" or row[9] == "0":
                continue
            local_ip, _, local_port = row[1].partition(":")
            if local_port == f"{port:04X}" and (row[1] == want or set(local_ip) == {"0"}):
                return int(row[7])
    return None


def _local_ip(host: str) -> str | None:
    """The IP to look up when ``host`` is this machine, else None."""
    try:
        addr = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        if host not in ("localhost", socket.gethostname()):
            return None
        try:
            return socket.gethostbyname(host)
        except OSError:
            return None
    return str(addr) if addr.is_loopback else None


def expected_proof(token: str, nonce: str, port: int) -> str:
    """What an agent holding ``token`` answers on ``port`` (the agent's access.proof)."""
    msg = f"probe-agent-proof:{nonce}:{port}".encode()
    return hmac.new(token.encode(), msg, hashlib.sha256).hexdigest()


def check_agent(endpoint: Endpoint, *, token: str | None, cacert: str | None,
                health: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """Raise ``UntrustedAgentError`` when ``endpoint`` is not shown to be the job's agent.

    Args:
        health: sends ``GET /v1/health`` with these query parameters and no token, and returns
            the decoded body (raising the client's usual errors when it cannot).
    """
    me = os.getuid()
    if endpoint.uds:
        try:
            uid = os.stat(endpoint.uds).st_uid
        except OSError:
            return  # the connection itself will say what is wrong
        if not _trusted_uid(uid):
            raise _untrusted(endpoint, f"its socket belongs to uid {uid}, not to you (uid {me})",
                             reason=f"socket of uid {uid}")
        return
    parts = urlsplit(endpoint.base_url)
    host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    ip = _local_ip(host)
    if ip is not None:
        uid = listener_uid(ip, port)
        if uid is not None:
            if _trusted_uid(uid):
                return
            raise _untrusted(endpoint, (
                f"port {port} is served by uid {uid}, not by you (uid {me}) or root: another "
                f"user's process may be squatting on it (`ss -ltnp 'sport = :{port}'`)"),
                reason=f"not the job's agent: port served by uid {uid}",
                help_text=f"run probe as the job's owner (sudo -u '#{uid}' probe ...) only if "
                          "that uid runs the job; otherwise use the rank's PID (`probe ps`)")
        elif os.path.exists(_TABLES[0]):
            return  # nothing listens there: the connection is refused, and says so
    if parts.scheme == "https" and cacert is not None:
        return  # the certificate chains to the CA the operator pinned
    if token is None:
        return  # nothing secret to lose; the agent itself decides what a stranger may do
    nonce = secrets.token_hex(16)
    body = health({"challenge": nonce})
    if not hmac.compare_digest(str(body.get("proof") or ""), expected_proof(token, nonce, port)):
        raise _untrusted(endpoint, "it could not prove it holds the job's token for this port",
                         reason="not the job's agent: no token proof",
                         help_text="check the address; behind a port mapping, use TLS "
                                   "(PROBE_TLS_CERT on the job, --cacert here)")


def _untrusted(endpoint: Endpoint, why: str, *, reason: str,
               help_text: str | None = None) -> UntrustedAgentError:
    return UntrustedAgentError(
        f"not sending the token or code to {endpoint.label}: {why}; nothing was sent",
        url=endpoint.label, reason=reason, help_text=help_text)
