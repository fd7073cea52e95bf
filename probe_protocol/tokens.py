"""What the job's token signs, computed the same way by the agent and the CLI. Stdlib only.

- The token proof: an agent answers ``GET /v1/health?challenge=NONCE`` with
  ``HMAC(token, nonce, ip, port)``, where ``ip:port`` is the address the client's connection
  reached (the agent's side of the accepted socket). Every node of a job holds the same token
  and the same port numbers, so a proof that named only the port could be relayed: a squatter
  on node A passes the challenge to the real agent on node B, and the CLI would take B's answer
  for A's. With the address in it, B's answer names B, and the CLI, which dialled A, refuses it.
  Behind NAT or a port mapping the two sides see different addresses: use TLS there.
- A rank's entry in the job's c10d store (``probe_agent/rank{N}``) carries ``sig``, an HMAC of
  its rank, URL, host and pid with the token. The store has no authentication: any local user
  who can reach it may rewrite an entry, so the CLI uses an entry only if the signature holds.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Mapping
from typing import Any


def _normal_ip(ip: str) -> str:
    try:
        addr = ipaddress.ip_address(ip.strip("[]").split("%", 1)[0])
    except ValueError:
        return ip.strip("[]").lower()
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return str(addr)


def _mac(token: str, text: str) -> str:
    return hmac.new(token.encode(), text.encode(), hashlib.sha256).hexdigest()


def proof(token: str, nonce: str, ip: str, port: int) -> str:
    """The answer to a health challenge from an agent reached at ``ip:port`` (any spelling of
    the address: IPv4-mapped IPv6 and IPv4 give the same proof)."""
    return _mac(token, f"probe-agent-proof:v2:{nonce}:{_normal_ip(ip)}:{port}")


def _entry_text(entry: Mapping[str, Any]) -> str:
    return "probe-rank-entry:v1:" + "\n".join(
        str(entry.get(k)) for k in ("rank", "url", "host", "pid"))


def sign_entry(token: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    """``entry`` with its ``sig``."""
    return {**entry, "sig": _mac(token, _entry_text(entry))}


def entry_signed(token: str, entry: Mapping[str, Any]) -> bool:
    """True when ``entry``'s ``sig`` was made with ``token`` over this rank, URL, host and pid."""
    sig = entry.get("sig")
    return isinstance(sig, str) and hmac.compare_digest(sig, _mac(token, _entry_text(entry)))
