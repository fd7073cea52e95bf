"""Before a token leaves the CLI: is that address the job's agent?

The ports are predictable (9700 + local rank), so another local user can listen on one first and
wait for an operator's token and code. Two checks, in this order:

- every connection (guard.py): a server end on this machine must belong to us or root, and a
  unix socket's server must be us or root. That covers every spelling of a local address,
  because it asks about the socket actually connected.
- once per client, when we hold a token and the agent is on another host: ``https`` verified
  against ``--cacert`` (a pinned CA), or the agent proves it holds the same token for the
  address we dialled (``GET /v1/health?challenge``, probe_protocol/tokens.py) before the token
  is sent. A proof relayed from another node names that node's address and is refused. Without
  a token there is nothing secret to send.

Ranks learnt from ``/v1/ranks`` (and so from the job's c10d store, which anyone who reaches it
can write) are checked by ``rank_entry_problem`` before they are dialled at all: signed with the
token, or, without a token, on loopback (dialled then only if the socket reached is on this
machine).
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
import socket
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from probe_protocol.tokens import entry_signed, proof

from ..errors import AgentHTTPError
from .guard import Dialled, refusal
from .targets import Endpoint


def check_agent(endpoint: Endpoint, *, token: str | None, cacert: str | None,
                health: Callable[[dict[str, Any]], dict[str, Any]], dialled: Dialled) -> None:
    """Raise ``UntrustedAgentError`` when ``endpoint`` is not shown to be the job's agent.

    Args:
        health: sends ``GET /v1/health`` with these query parameters and no token, and returns
            the decoded body (raising the client's usual errors when it cannot); its connection
            goes through guard.py, which fills ``dialled``.
        dialled: what the client's connection reached (guard.Dialled).
    """
    if endpoint.uds or token is None:
        return  # a unix socket's server uid is checked at connect; no token: nothing secret
    parts = urlsplit(endpoint.base_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    nonce = secrets.token_hex(16)
    try:
        body = health({"challenge": nonce})  # connects: the owner check has run by now
    except AgentHTTPError:
        if not dialled.local:
            raise
        body = {}  # an answer from a socket of ours: the agent itself will judge the token
    if dialled.local:
        return  # the server end is on this machine and ours (or root's)
    if parts.scheme == "https" and cacert is not None:
        return  # the certificate chains to the CA the operator pinned
    want = proof(token, nonce, dialled.ip or "", port)
    if not hmac.compare_digest(str(body.get("proof") or ""), want):
        raise refusal(endpoint.label, (
            f"it could not prove it holds the job's token for {dialled.ip}:{port} (a proof "
            "made for another address is a relay)"),
            reason="not the job's agent: no token proof for this address",
            help_text="check the address; across nodes use TLS (PROBE_TLS_CERT on the job, "
                      "--cacert here: `probe launch --make-cert` makes both); behind a port "
                      "mapping TLS is the only way")


def on_loopback(url: str) -> bool:
    """Is ``url``'s host a loopback address, in any spelling the resolver takes (``127.1``,
    ``2130706433``, ``[::ffff:127.0.0.1]``, ``localhost``)? Judged on the text, no lookup."""
    try:
        host = urlsplit(url).hostname or ""
    except ValueError:
        return False
    if host == "localhost":
        return True
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        try:  # the forms inet_aton takes: 127.1, 2130706433, 0x7f000001
            addr = ipaddress.ip_address(socket.inet_aton(host))
        except OSError:
            return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


def rank_entry_problem(entry: Mapping[str, Any], token: str | None) -> str | None:
    """Why a discovered rank's entry must not be used, or None. With a token, the entry must be
    signed with it (probe_protocol.tokens). Without one, it must stay on this machine: a job
    without a token serves TCP on loopback only, so an entry anywhere else was written by
    someone else (the c10d store has no authentication); one on loopback is dialled, and
    guard.py refuses it unless its listener is ours (and, ``this_machine_only``, local)."""
    if token is None:
        url = entry.get("url")
        if isinstance(url, str) and url and not on_loopback(url):
            return ("its address is off this machine, and a job without a token has no rank "
                    "there (its agents serve TCP on loopback only)")
        return None
    if "sig" not in entry:
        return "its entry in the job's rank list is not signed with the job's token"
    if not entry_signed(token, entry):
        return "its entry in the job's rank list has a wrong signature (forged or altered)"
    return None
