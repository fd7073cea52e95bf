"""Who is on the other end of a connection, by the kernel's word. Stdlib only.

A unix-socket peer's uid comes from SO_PEERCRED. A TCP peer on this machine is the owner of the
*other end's* socket, asked of the kernel by exact 4-tuple over NETLINK_SOCK_DIAG, with
/proc/net/tcp{,6} as the fallback. Both sides ask here: the agent and its watchdog about the
client that connected (``tcp_peer``; probe_agent/access.py decides what it may do), and the CLI
and its dashboard about the server it connected to or the browser that connected to it
(``server_owner``, ``tcp_peer``) before a byte of token or code is sent.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Peer:
    """The other end of a connection, as far as the kernel tells us.

    ``kind`` is 'unix', 'local' (TCP from this machine, uid read from /proc/net) or 'remote'
    (TCP from elsewhere: no uid). ``uid`` is None when unknown."""

    kind: str
    uid: int | None
    address: str

    def label(self) -> str:
        return self.address if self.uid is None else f"{self.address} uid={self.uid}"


def unix_peer_uid(sock: socket.socket) -> int | None:
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    return struct.unpack("3i", creds)[1]


def _parse_ip(ip: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        # A v4 client of a dual-stack listener: its own socket is AF_INET.
        return addr.ipv4_mapped
    return addr


_SOCK_DIAG_BY_FAMILY = 20
_NLMSG_ERROR = 2
_NLM_F_REQUEST = 1
_NETLINK_SOCK_DIAG = 4
_INET_DIAG_NOCOOKIE = 0xFFFFFFFF


def _diag_lookup(local: tuple[str, int], remote: tuple[str, int], *, mapped: bool = False
                 ) -> tuple[int, int] | None:
    """(uid, inode) of the TCP socket ``local`` -> ``remote``, asked of the kernel by exact
    4-tuple over NETLINK_SOCK_DIAG: one lookup, whatever the number of sockets on the node
    (reading /proc/net/tcp per connection made a 520-connection flood cost O(n²) and delayed
    the owner's answer by 3.6 s). None when there is no such socket; OSError where netlink
    sock_diag is not available.

    Args:
        mapped: look for IPv4 addresses as an AF_INET6 socket holds them (``::ffff:a.b.c.d``):
            the server end of a v4 connection to a dual-stack ``[::]`` listener.
    """
    a, b = _parse_ip(local[0]), _parse_ip(remote[0])
    if a is None or b is None or a.version != b.version:
        return None
    if mapped:
        if a.version != 4:
            return None
        a, b = (ipaddress.IPv6Address(f"::ffff:{x}") for x in (a, b))
    if not hasattr(socket, "AF_NETLINK"):
        raise OSError("no netlink here (not Linux)")
    family = socket.AF_INET if a.version == 4 else socket.AF_INET6
    sockid = struct.pack("!HH16s16s", local[1], remote[1], a.packed.ljust(16, b"\0"),
                         b.packed.ljust(16, b"\0"))
    sockid += struct.pack("=III", 0, _INET_DIAG_NOCOOKIE, _INET_DIAG_NOCOOKIE)
    req = struct.pack("=BBBxI", family, socket.IPPROTO_TCP, 0, 0xFFFFFFFF) + sockid
    msg = struct.pack("=IHHII", 16 + len(req), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0) + req
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(1.0)
        nl.send(msg)
        data = nl.recv(65536)
    _length, kind = struct.unpack_from("=IH", data)
    if kind == _NLMSG_ERROR:
        errno_ = -struct.unpack_from("=i", data, 16)[0]
        if errno_ in (0, 2):  # ENOENT: no such socket
            return None
        raise OSError(errno_, "sock_diag lookup failed")
    # nlmsghdr (16) + inet_diag_msg: family, state, timer, retrans (4), sockid (48),
    # expires, rqueue, wqueue (12), then uid and inode.
    uid, inode = struct.unpack_from("=II", data, 16 + 4 + 48 + 12)
    return uid, inode


def _proc_lookup(local: tuple[str, int], remote: tuple[str, int]) -> tuple[int, int] | None:
    """The same from /proc/net/tcp{,6} (addresses as 32-bit words in host byte order)."""
    a, b = _parse_ip(local[0]), _parse_ip(remote[0])
    if a is None or b is None or a.version != b.version:
        return None

    def hexed(addr: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int) -> str:
        words = struct.unpack(f"={len(addr.packed) // 4}I", addr.packed)
        return "".join(f"{w:08X}" for w in words) + f":{port:04X}"

    want_local, want_remote = hexed(a, local[1]), hexed(b, remote[1])
    table = "/proc/net/tcp" if a.version == 4 else "/proc/net/tcp6"
    try:
        with open(table, encoding="ascii") as f:
            next(f, None)
            for line in f:
                row = line.split()
                if len(row) >= 10 and row[1] == want_local and row[2] == want_remote:
                    return int(row[7]), int(row[9])
    except OSError:
        pass
    return None


def connection_owner(local: tuple[str, int], remote: tuple[str, int]) -> int | None:
    """The uid owning the TCP socket bound to ``local`` and connected to ``remote`` (this
    network namespace's), or None.

    Only a socket still held by a process counts (inode ≠ 0): a closed socket's TIME_WAIT or
    orphaned FIN_WAIT entry reports uid 0, and must never pass for root."""
    try:
        found = _diag_lookup(local, remote)
    except OSError:
        found = _proc_lookup(local, remote)
    if found is None or found[1] == 0:
        return None
    return found[0]


def is_local_address(ip: str, local_ip: str) -> bool:
    """True when a TCP peer is this machine: loopback, or our own address on the socket."""
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback or ip == local_ip


def tcp_peer(sock: socket.socket) -> Peer:
    try:
        local, remote = sock.getsockname(), sock.getpeername()
    except OSError:
        return Peer("remote", None, "tcp")
    address = f"{remote[0]}:{remote[1]}"
    if not is_local_address(remote[0], local[0]):
        return Peer("remote", None, address)
    # The client's socket is bound to the peer address, connected to our local address.
    return Peer("local", connection_owner((remote[0], remote[1]), (local[0], local[1])), address)


def server_owner(sock: socket.socket) -> tuple[bool, int | None]:
    """For a connected TCP client socket: is the server's end on this machine (in this network
    namespace), and which uid owns it. The server's socket is bound to our peer address and
    connected to ours, whatever spelling of the host was dialled (``127.1``, ``2130706433``,
    ``[::ffff:127.0.0.1]``, a name): the kernel answers for the socket actually connected.

    ``(False, None)`` when no socket of this machine is the other end (another host), and where
    this OS cannot say (no sock_diag, no /proc/net: not Linux, where a laptop's CLI reaches
    agents through tunnels; it is then treated as another host: TLS or the token proof).
    ``(True, None)`` for a loopback address whose server end Linux does not show (a port
    mapped into another network namespace): callers must refuse, not trust."""
    local, remote = sock.getsockname()[:2], sock.getpeername()[:2]
    server, client = (remote[0], remote[1]), (local[0], local[1])
    try:
        found = _diag_lookup(server, client) or _diag_lookup(server, client, mapped=True)
        can_tell = True
    except OSError:
        found = _proc_lookup(server, client)
        can_tell = os.path.exists("/proc/net/tcp")
    if found is not None:
        # A server socket not yet accept()ed has inode 0 but already the listener's uid.
        return True, found[0]
    ip = _parse_ip(str(remote[0]))
    local_ip = can_tell and ip is not None and ip.is_loopback
    return (True, None) if local_ip else (False, None)
