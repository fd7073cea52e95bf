"""Every connection the CLI opens is checked on the socket actually connected, before a byte of
a request (token, code, SQL) goes out on it.

httpx resolves and connects; this network backend then asks the kernel who serves the other
end (probe_protocol.peers), so every spelling of an address is judged by where it really led:

- TCP whose server end is on this machine (any loopback form, IPv4-mapped IPv6, ``127.1``,
  ``2130706433``, a name resolving to this machine, or one of its own addresses): that socket
  must belong to us or to root. Anything else is a squatter, token or not: the job's agents run
  as the job's owner, and a squatter could relay a token proof from a real agent.
- TCP to another machine: recorded (``Dialled.local`` False) for trust.check_agent, which then
  wants TLS with ``--cacert`` or the token proof bound to the address dialled.
- TCP to another machine for a rank learnt from the rank list of a job without a token
  (``Endpoint.this_machine_only``): refused; such a job has no rank there worth trusting.
- a unix socket: the server's uid (SO_PEERCRED, asked from the client side) must be ours or
  root's. Checking the socket file before connecting is not enough: a symlink flipped between
  the check and the connect sends the request elsewhere.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import httpcore

from probe_protocol.peers import server_owner, unix_peer_uid

from ..errors import UntrustedAgentError


def trusted_uid(uid: int | None) -> bool:
    return uid is not None and uid in (os.getuid(), 0)


def normal_ip(ip: str) -> str:
    """One spelling per address: IPv4-mapped IPv6 as IPv4, no zone, compressed IPv6."""
    addr = ipaddress.ip_address(ip.split("%", 1)[0])
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return str(addr)


@dataclass(slots=True)
class Dialled:
    """What the last connection of one client reached: ``ip`` as the socket connected to it
    (normalised), and whether its server end is on this machine (then already owner-checked)."""

    ip: str | None = None
    local: bool = False


class GuardedBackend(httpcore.SyncBackend):
    """httpcore's own backend plus the owner check after each connect (module docstring).

    Args:
        label: the endpoint as the operator sees it, for the refusal's message.
        dialled: updated on every TCP connect; trust.check_agent reads it.
    """

    def __init__(self, label: str, dialled: Dialled, this_machine_only: bool = False) -> None:
        self.label = label
        self.dialled = dialled
        self.this_machine_only = this_machine_only

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        stream = super().connect_tcp(host, port, timeout, local_address, socket_options)
        sock: socket.socket = stream.get_extra_info("socket")
        try:
            on_this_machine, uid = server_owner(sock)
            peer_ip = normal_ip(sock.getpeername()[0])
        except (OSError, ValueError):
            on_this_machine, uid, peer_ip = True, None, None
        if on_this_machine and not trusted_uid(uid):
            stream.close()
            me = os.getuid()
            if uid is None:
                raise refusal(self.label, "this machine does not show who serves that "
                              "loopback port (mapped from another network namespace?), so it "
                              "may be another user's", reason="not the job's agent: owner unknown",
                              help_text="reach the agent by PID (`probe ps`), or over TLS at "
                                        "an address of its own node with --cacert")
            raise refusal(
                self.label,
                f"port {port} is served by uid {uid}, not by you (uid {me}) or root: another "
                f"user's process may be squatting on it (`ss -ltnp 'sport = :{port}'`)",
                reason=f"not the job's agent: port served by uid {uid}",
                help_text=f"run probe as the job's owner (sudo -u '#{uid}' probe ...) only if "
                          "that uid runs the job; otherwise use the rank's PID (`probe ps`)")
        if self.this_machine_only and not on_this_machine:
            # The URL looked local but led elsewhere (a name resolving off the machine).
            stream.close()
            raise refusal(self.label, "it is off this machine, and this rank was learnt from "
                          "the rank list of a job without a token",
                          reason="dropped: off this machine, no token",
                          help_text="give the job a token (PROBE_TOKEN) to reach ranks on "
                                    "other machines")
        self.dialled.ip, self.dialled.local = peer_ip, on_this_machine
        return stream

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None
                            ) -> httpcore.NetworkStream:
        stream = super().connect_unix_socket(path, timeout, socket_options)
        uid = unix_peer_uid(stream.get_extra_info("socket"))
        if not trusted_uid(uid):
            stream.close()
            raise refusal(self.label, f"its socket is served by uid {uid}, not by you "
                          f"(uid {os.getuid()}) or root", reason=f"socket of uid {uid}")
        return stream


def refusal(label: str, why: str, *, reason: str,
            help_text: str | None = None) -> UntrustedAgentError:
    return UntrustedAgentError(
        f"not sending the token or code to {label}: {why}; nothing was sent",
        url=label, reason=reason, help_text=help_text)


def install(transport: Any, label: str, dialled: Dialled,
            this_machine_only: bool = False) -> None:
    """Put the guarded backend under an ``httpx.HTTPTransport``'s connection pool. httpx has no
    public hook for it; a pool without the attribute would silently skip the check, so fail
    loudly instead."""
    pool = transport._pool
    if not hasattr(pool, "_network_backend"):
        raise RuntimeError("this httpcore has no ConnectionPool._network_backend: probe cannot "
                           "check who serves an address; install httpcore 1.x")
    pool._network_backend = GuardedBackend(label, dialled, this_machine_only)
