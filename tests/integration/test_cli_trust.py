"""The CLI checks an agent before it sends a token or code (issue 19, probe_cli/trust.py).

A squatter is a real process of another uid (tests/foreign.py) that listens first on a port the
operator will name, or that a job's rank list points to, and records every byte it receives.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import httpx
import pytest

from probe_cli.errors import UntrustedAgentError
from probe_cli.main import main
from probe_cli.transport.targets import Endpoint
from probe_cli.transport.trust import check_agent
from tests.foreign import FOREIGN_UID, need_root, run_as
from tests.support import wait_until
from tests.unit.cli_server import closed_port

pytest.importorskip("duckdb")
TOKEN = "squat-me-" + "x" * 16
CODE = "open('/etc/shadow').read()"


def _squat(port: int, seconds: float) -> str:
    """Listen on ``port`` as the calling uid; everything received in ``seconds``, as text."""
    import select
    import time

    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(16)
    got, conns = b"", []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([srv, *conns], [], [], left)
        for s in ready:
            if s is srv:
                conns.append(srv.accept()[0])
            else:
                data = s.recv(65536)
                got += data
                if not data:
                    conns.remove(s)
                elif b"\r\n\r\n" in data:  # answer like an agent would, to draw the token out
                    body = b'{"ok": true, "rank": 0, "ranks": [], "status": "ok", "result": "1"}'
                    s.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                              b"content-length: %d\r\n\r\n%s" % (len(body), body))
    return got.decode("latin-1")


@pytest.fixture
def squatter() -> Iterator[tuple[int, dict]]:
    """A uid-65534 process listening on a free port for 6 s: (port, {"received": text})."""
    need_root()
    port = closed_port()  # free now; the squatter binds it
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(received=run_as(FOREIGN_UID, _squat, port, 6)))
    t.start()

    def listening() -> bool:
        with socket.socket() as c:
            return c.connect_ex(("127.0.0.1", port)) == 0

    wait_until(listening, 5, "the squatter never listened")
    yield port, out
    t.join(15)


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
    wait_until(lambda: "received" in seen, 15, "the squatter never reported")
    assert seen["received"] == ""


def test_ranks_learnt_from_discovery_must_pass_the_same_check(make_agent, squatter, capsys):
    port, seen = squatter
    # GIVEN the job's real agent (with a token) lists rank 1 at the squatted port, as a forged
    # entry in the job's store would
    agent = make_agent(token=TOKEN)
    agent.peers[1] = {"rank": 1, "url": f"http://127.0.0.1:{port}", "host": "h", "pid": 1}
    # WHEN the operator fans out from the real agent
    code = main([agent.url.removeprefix("http://"), "--token", TOKEN, "eval", "6*7"])
    out, err = capsys.readouterr()
    # THEN rank 0 answers, rank 1 is reported as not the job's agent, and gets nothing
    assert code == 3, err
    assert "42" in out and f"uid {FOREIGN_UID}" in err
    wait_until(lambda: "received" in seen, 15, "the squatter never reported")
    assert seen["received"] == ""


def test_a_remote_agent_must_prove_the_token_before_it_is_sent(make_agent):
    """An address that is not this machine takes the token proof (GET /v1/health?challenge):
    here a name that is not local, whose health request goes to the real agent on loopback
    (no traffic leaves the machine)."""
    agent = make_agent(token=TOKEN)

    def health(params: dict) -> dict:
        return httpx.get(agent.url + "/v1/health", params=params).json()

    remote = Endpoint(f"http://agent.invalid:{agent.tcp_port}")
    check_agent(remote, token=TOKEN, cacert=None, health=health)  # proves it: no error
    with pytest.raises(UntrustedAgentError, match="could not prove it holds the job's token"):
        check_agent(remote, token="another-token", cacert=None, health=health)
    # a relay to another port cannot pass: the proof names the agent's own port
    relayed = Endpoint(f"http://agent.invalid:{agent.tcp_port + 1}")
    with pytest.raises(UntrustedAgentError):
        check_agent(relayed, token=TOKEN, cacert=None, health=health)
    # without a token there is nothing to prove, and nothing secret to send
    check_agent(remote, token=None, cacert=None, health=health)


def test_a_token_file_others_can_read_is_refused_by_the_cli(tmp_path, capsys):
    path = tmp_path / "token"
    path.write_text(TOKEN)
    path.chmod(0o640)
    assert main(["127.0.0.1:9", "--token-file", str(path), "info"]) == 2
    assert f"chmod 600 {path}" in capsys.readouterr().err
