"""The job's c10d store, written by another user: rank entries forged, inflated, or flooded.

The store has no authentication, so another uid (65534, tests/foreign.py) that reaches its port
writes what it likes under ``probe_agent/``. The registry here is the agent's own
(probe_agent/ranks.py) over a real TCPStore, with a world of two ranks whose rank 1 is the
attacker's entry (one process cannot start a two-rank process group; the registry is given the
store and the world size ``_arm`` would find). The "other machine" is a real network namespace
behind a veth pair: a listener there is off this machine as the kernel sees it.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from probe_cli.main import main
from tests.attackers import store_write
from tests.foreign import FOREIGN_UID, need_root, run_as
from tests.support import wait_until

dist = pytest.importorskip("torch.distributed")
pytest.importorskip("duckdb")

ROOT = Path(__file__).resolve().parents[2]
CODE = "'the owner code'"


@pytest.fixture
def store() -> Iterator[object]:
    st = dist.TCPStore("127.0.0.1", 0, world_size=1, is_master=True, wait_for_workers=False)
    yield st


def registry(agent: object, st: object, world_size: int = 2) -> object:
    """The agent's rank registry over ``st``, as ``_arm`` would leave it for a world of
    ``world_size``; its reads feed the agent's ``peers`` (what /v1/ranks serves)."""
    from probe_agent.ranks import STORE_PREFIX, RankRegistry

    reg = RankRegistry(agent._entry, on_group=lambda r, w: None,  # type: ignore[attr-defined]
                       on_peers=lambda p: setattr(agent, "peers", p), refresh_s=0.0)
    reg.store = dist.PrefixStore(STORE_PREFIX, st)
    reg.world_size = world_size
    return reg


def tick(reg: object) -> None:
    """One read of the store now (the registry's own thread would wait for its next turn)."""
    reg._next = 0.0  # type: ignore[attr-defined]
    reg.tick()  # type: ignore[attr-defined]


def forge(st: object, *items: tuple[str, object], big: list[object] | None = None) -> None:
    """Write ``items`` (key under probe_agent/, value) into the store as uid 65534."""
    need_root()
    pairs = [[f"probe_agent/{k}", v if isinstance(v, str) else json.dumps(v)] for k, v in items]
    run_as(FOREIGN_UID, store_write, "127.0.0.1", st.port, pairs, big)  # type: ignore[attr-defined]


@pytest.fixture
def other_host() -> Iterator[tuple[str, int, object]]:
    """A listener on another machine as the kernel sees it: ``(ip, port, received)`` for a
    squatter in a network namespace of its own behind a veth pair; ``received()`` stops it and
    returns what it got."""
    need_root()
    # a number of its own picks the interface names, the /30 and the port; a pid under 1000
    # once made a 3-digit prefix that the parse below read into the hex suffix
    slot = os.getpid() % 10000
    tag = f"{slot:04d}{uuid.uuid4().hex[:3]}"
    ns, a, b = f"probe-t{tag}", f"pt{tag}a", f"pt{tag}b"
    # a /30 of its own in 169.254.220.0/22 (link-local)
    net = ipaddress.ip_address("169.254.220.0") + 4 * (slot % 256)
    host_ip, ns_ip = str(net + 1), str(net + 2)

    def sh(*cmd: str) -> None:
        subprocess.run(cmd, check=True, capture_output=True)

    try:
        sh("ip", "netns", "add", ns)
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"cannot make a network namespace here: {e}")
    stop = f"/tmp/probe-squat-{uuid.uuid4().hex}"
    proc = None
    try:
        sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
        sh("ip", "link", "set", b, "netns", ns)
        sh("ip", "addr", "add", f"{host_ip}/30", "dev", a)
        sh("ip", "link", "set", a, "up")
        sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{ns_ip}/30", "dev", b)
        sh("ip", "netns", "exec", ns, "ip", "link", "set", b, "up")
        port = 9700 + slot % 200
        code = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
                "from tests.attackers import squat\n"
                f"sys.stdout.write(squat({port}, 60, {stop!r}))\n")
        proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", code],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        def listening() -> bool:
            return subprocess.run(["ip", "netns", "exec", ns, "ss", "-Hltn", f"sport = :{port}"],
                                  capture_output=True, text=True).stdout.strip() != ""

        wait_until(listening, 30, "the squatter in the other namespace never listened")

        def received() -> str:
            open(stop, "w").close()
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
            return out

        yield ns_ip, port, received
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        if os.path.exists(stop):
            os.unlink(stop)
        subprocess.run(["ip", "link", "del", a], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_a_tokenless_cli_dials_no_rank_entry_off_this_machine(make_agent, store, other_host,
                                                              capsys):
    """Before, another uid rewrote rank 1's entry to a host of its own, and the owner's plain
    ``probe eval`` sent its code there and printed the forged answer as rank 1's, exit 0."""
    ip, port, received = other_host
    agent = make_agent()  # no token: the default
    reg = registry(agent, store)
    tick(reg)
    # GIVEN uid 65534 writes rank 1's entry (a URL on another machine) and bumps the generation
    # so that every rank reads it
    forge(store, ("rank1", {"rank": 1, "url": f"http://{ip}:{port}", "host": "h", "pid": 1}),
          ("generation", "1000"))
    tick(reg)
    assert agent.peers[1].url == f"http://{ip}:{port}"  # the agent serves what the store says
    # WHEN the owner fans out from the real agent without a token
    code = main([agent.url.removeprefix("http://"), "eval", CODE])
    out, err = capsys.readouterr()
    # THEN rank 0 answers, rank 1 is dropped with why, the result is partial, nothing was sent
    assert code == 3, err
    assert "the owner code" in out and "pwned" not in out
    assert "dropped: its address is off this machine" in err, err
    # AND the socket reached is judged too, not only the URL's text (a name could lead
    # elsewhere): an endpoint learnt from a tokenless rank list, connected off the machine
    from probe_cli.errors import UntrustedAgentError
    from probe_cli.transport.client import ProbeClient
    from probe_cli.transport.targets import Endpoint

    with ProbeClient(Endpoint(f"http://{ip}:{port}", this_machine_only=True)) as c:
        with pytest.raises(UntrustedAgentError, match="off this machine"):
            c.eval(CODE)
    assert received() == ""


def test_a_rewritten_own_entry_is_published_again(make_agent, store):
    agent = make_agent()
    reg = registry(agent, store)
    tick(reg)
    mine = bytes(reg.store.get("rank0"))
    # GIVEN uid 65534 rewrites this rank's own entry to point at a port of its own
    forge(store, ("rank0", {"rank": 0, "url": "http://127.0.0.1:1", "host": "h", "pid": 1}))
    assert bytes(reg.store.get("rank0")) != mine
    # WHEN the registry next refreshes
    tick(reg)
    # THEN the entry is ours again, and /v1/ranks says it had to be published again
    assert bytes(reg.store.get("rank0")) == mine
    assert reg.describe()["republished"] == 1


def test_store_reads_are_bounded_whatever_is_in_the_store(make_agent, store):
    agent = make_agent()
    reg = registry(agent, store)
    tick(reg)
    # GIVEN uid 65534 floods the prefix: an oversized rank 1, a rank the job does not have,
    # rank-like junk keys, and an entry under rank 1's key claiming to be rank 0
    forge(store, ("rank1", "x" * (1 << 20)), ("rank7", {"rank": 7, "url": "http://127.0.0.1:2"}),
          ("generation", "5000"), big=["probe_agent/rank1junk", 50, 64 * 1024])
    tick(reg)
    # THEN only rank 0 is known, the oversized entry was deleted after one read, and nothing
    # past the world size or under another name is taken
    assert set(agent.peers) == {0}
    assert not reg.store.check(["rank1"])
    assert reg.describe()["dropped"] == 1
    forge(store, ("rank1", {"rank": 0, "url": "http://127.0.0.1:3", "host": "h", "pid": 1}),
          ("generation", "6000"))
    tick(reg)
    assert set(agent.peers) == {0} and agent.peers[0].url == agent.url
    # AND a real rank 1 publishing afterwards is found
    st1 = dist.PrefixStore("probe_agent", store)
    st1.set("rank1", json.dumps({"rank": 1, "url": "http://127.0.0.1:4", "host": "h", "pid": 2}))
    st1.add("generation", 1)
    wait_until(lambda: (tick(reg), 1 in agent.peers)[1], 10, "rank 1 never found")
