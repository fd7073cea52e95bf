"""The CLI checks an agent before it sends a token or code (probe_cli/transport/guard.py and
trust.py).

A squatter is a real process of another uid (tests/foreign.py) that listens first on a port the
operator will name, or that a job's rank list points to, and records every byte it receives. It
listens dual-stack on every address, so that every spelling of this machine reaches it.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterator

import httpx
import pytest

from probe_cli.errors import UntrustedAgentError
from probe_cli.main import main
from probe_cli.transport.guard import Dialled
from probe_cli.transport.targets import Endpoint
from probe_cli.transport.trust import check_agent
from probe_protocol.bodies import RankEntry
from tests.attackers import relay, squat
from tests.foreign import FOREIGN_UID, need_root, run_as
from tests.support import wait_until
from tests.unit.cli_server import closed_port

pytest.importorskip("duckdb")
TOKEN = "squat-me-" + "x" * 16
CODE = "open('/etc/shadow').read()"


@pytest.fixture
def squatter() -> Iterator[tuple[int, Callable[[], str]]]:
    """A uid-65534 process listening on a free port (at most 30 s): (port, received), where
    ``received()`` stops it and returns everything it got, as text."""
    need_root()
    port = closed_port()  # free now; the squatter binds it
    stop = f"/tmp/probe-squat-{uuid.uuid4().hex}"
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(
        received=run_as(FOREIGN_UID, squat, port, 30, stop, timeout=45)))
    t.start()

    def listening() -> bool:
        with socket.socket() as c:
            return c.connect_ex(("127.0.0.1", port)) == 0

    def received() -> str:
        open(stop, "w").close()
        t.join(40)
        assert "received" in out, "the squatter never reported"
        return out["received"]

    wait_until(listening, 5, "the squatter never listened")
    try:
        yield port, received
    finally:
        if not os.path.exists(stop):
            open(stop, "w").close()
        t.join(40)
        os.unlink(stop)


def test_the_cli_sends_a_squatter_neither_token_nor_code(squatter, capsys):
    port, seen = squatter
    # WHEN the operator names the squatted port with the job's token
    code = main([f"127.0.0.1:{port}", "--token", TOKEN, "eval", CODE])
    err = capsys.readouterr().err
    # THEN the CLI refuses and says what it found there
    assert code == 1, err
    assert f"port {port} is served by uid {FOREIGN_UID}" in err and "nothing was sent" in err
    # AND nothing else the operator tries reaches it either
    for argv in (["eval", CODE], ["backtrace"], ["query", "SELECT 1"]):
        assert main([f"127.0.0.1:{port}", *argv]) == 1
    capsys.readouterr()
    assert seen() == ""


def _loopback_spellings(port: int) -> list[str]:
    names = ["127.0.0.1", "127.1", "2130706433", "0x7f000001", "127.0.0.2", "127.255.255.254",
             "[::ffff:127.0.0.1]", "[::ffff:7f00:1]", "[::1]", "localhost"]
    try:  # a name of this machine resolves to one of its own addresses
        socket.getaddrinfo(socket.gethostname(), port)
        names.append(socket.gethostname())
    except OSError:
        pass
    return [f"{n}:{port}" for n in names]


def test_every_spelling_of_this_machine_reaches_no_squatter(squatter, capsys):
    """Before, only 127.0.0.1 and localhost were checked: 127.1, 2130706433 and
    [::ffff:127.0.0.1] sent the token and the code to whoever held the port."""
    port, seen = squatter
    refused = {}
    for target in _loopback_spellings(port):
        # WHEN the operator names the squatted port, spelt this way, with the job's token
        code = main([target, "--token", TOKEN, "eval", CODE])
        refused[target] = (code, capsys.readouterr().err)
    # THEN every spelling is refused, by the owner of the socket actually connected
    for target, (code, err) in refused.items():
        assert code == 1 and f"served by uid {FOREIGN_UID}" in err, (target, err)
    # AND the squatter received not one byte of token or code
    assert seen() == ""


def test_ranks_learnt_from_discovery_must_pass_the_same_check(make_agent, squatter, capsys):
    port, seen = squatter
    # GIVEN the job's real agent (no token: nothing to sign with) lists rank 1 at the squatted
    # port in an IPv4-mapped spelling, as a forged entry in the job's store would
    agent = make_agent()
    agent.peers[1] = RankEntry(1, f"http://[::ffff:127.0.0.1]:{port}", "h", 1)
    # WHEN the operator fans out from the real agent
    code = main([agent.url.removeprefix("http://"), "eval", "6*7"])
    out, err = capsys.readouterr()
    # THEN rank 0 answers, rank 1 is reported as not the job's agent, and gets nothing
    assert code == 3, err
    assert "42" in out and f"uid {FOREIGN_UID}" in err
    assert seen() == ""


def test_a_remote_agent_must_prove_the_token_before_it_is_sent(make_agent):
    """An address that is not this machine takes the token proof (GET /v1/health?challenge):
    here the connection is taken as another node's (``Dialled.local`` False), and its health
    request goes to the real agent on loopback (no traffic leaves the machine)."""
    agent = make_agent(token=TOKEN)

    def health(params: dict) -> dict:
        return httpx.get(agent.url + "/v1/health", params=params).json()

    remote = Endpoint(f"http://127.0.0.1:{agent.tcp_port}")
    node = Dialled("127.0.0.1", local=False)
    check_agent(remote, token=TOKEN, cacert=None, health=health, dialled=node)  # proves it
    with pytest.raises(UntrustedAgentError, match="could not prove it holds the job's token"):
        check_agent(remote, token="another-token", cacert=None, health=health, dialled=node)
    # a relay to another port cannot pass: the proof names the agent's own port
    relayed = Endpoint(f"http://127.0.0.1:{agent.tcp_port + 1}")
    with pytest.raises(UntrustedAgentError):
        check_agent(relayed, token=TOKEN, cacert=None, health=health, dialled=node)
    # without a token there is nothing to prove, and nothing secret to send
    check_agent(remote, token=None, cacert=None, health=health, dialled=node)


def test_a_proof_relayed_from_another_node_is_refused(make_agent):
    """Every node of a job has the same token and the same ports. A squatter on node A (here
    127.0.0.1) relays the challenge to the real agent on node B (127.0.0.2, same port): B's
    proof names the address B was reached at, not the one the CLI dialled. Before, the proof
    covered (nonce, port) only, and the relay passed."""
    # GIVEN the real agent of "node B" and a relay on "node A" at the same port number
    agent = make_agent(token=TOKEN, host="127.0.0.2")
    port = agent.tcp_port
    stop = threading.Event()
    relay_thread = threading.Thread(target=relay, daemon=True, args=(
        ("127.0.0.1", port), ("127.0.0.2", port), stop))
    relay_thread.start()
    try:
        def health_via(host: str):
            return lambda params: httpx.get(f"http://{host}:{port}/v1/health", params=params,
                                            timeout=5).json()

        wait_until(lambda: health_via("127.0.0.1")({}).get("ok"), 10, "relay never answered")
        # WHEN the CLI checks node A, taken as another machine (as it would be across nodes)
        node_a = Endpoint(f"http://127.0.0.1:{port}")
        with pytest.raises(UntrustedAgentError, match="relay"):
            check_agent(node_a, token=TOKEN, cacert=None, health=health_via("127.0.0.1"),
                        dialled=Dialled("127.0.0.1", local=False))
        # THEN the refusal came from the proof; node B itself, dialled directly, proves it
        check_agent(Endpoint(f"http://127.0.0.2:{port}"), token=TOKEN, cacert=None,
                    health=health_via("127.0.0.2"), dialled=Dialled("127.0.0.2", local=False))
    finally:
        stop.set()
        relay_thread.join(5)


def test_a_poisoned_store_entry_is_dropped_and_the_cli_says_why(make_agent, squatter, capsys):
    """The job's c10d store has no authentication: whoever reaches its port may rewrite
    ``probe_agent/rank1``. With a token, the CLI dials only entries the token signed."""
    dist = pytest.importorskip("torch.distributed")
    port, seen = squatter
    # GIVEN a real agent with a token over a real TCPStore, and in its rank list an entry for
    # rank 1 that points at the squatter, unsigned, as a forged store entry would put it there
    # (tests/integration/test_store_forgery.py forges one in the store as another uid)
    agent = make_agent(token=TOKEN)
    store = dist.TCPStore("127.0.0.1", 0, world_size=1, is_master=True, wait_for_workers=False)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        wait_until(lambda: 0 in agent.peers, 20, "the agent never read the store")
        assert agent.peers[0].sig  # the agent signs what it publishes
        agent.peers = {**agent.peers, 1: RankEntry.from_wire(
            {"rank": 1, "url": f"http://[::ffff:127.0.0.1]:{port}", "host": "h", "pid": 1})}
        # WHEN the operator fans out with the job's token
        code = main([agent.url.removeprefix("http://"), "--token", TOKEN, "eval", "6*7"])
        out, err = capsys.readouterr()
    finally:
        dist.destroy_process_group()
    # THEN rank 0 answers; rank 1 is dropped, the CLI says why, and the result is partial
    assert code == 3, err
    assert "42" in out
    assert "failed: 1 (dropped: its entry in the job's rank list is not signed" in err, err
    assert seen() == ""


def test_a_token_file_others_can_read_is_refused_by_the_cli(tmp_path, capsys):
    path = tmp_path / "token"
    path.write_text(TOKEN)
    path.chmod(0o640)
    assert main(["127.0.0.1:9", "--token-file", str(path), "info"]) == 2
    assert f"chmod 600 {path}" in capsys.readouterr().err
