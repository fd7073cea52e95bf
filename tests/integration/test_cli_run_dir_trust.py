"""The CLI trusts a run dir and a unix socket only when they are the caller's (probe_cli/transport/
targets.py's run_dir_problem, guard.py's SO_PEERCRED check after connect).

The attacker is a real process of another uid (tests/foreign.py): it makes a directory, serves a
unix socket of its own that answers like an agent and records what it receives, and flips a
symlink between the real agent's socket and its own as fast as it can. Checking the socket file
before connecting (as the CLI did) loses that race now and then: 2 of 20 evals went to the
attacker in the report.
"""

from __future__ import annotations

import os
import shutil
import threading
import uuid
from collections.abc import Iterator

import pytest

from probe_cli.main import main
from tests.attackers import flip
from tests.foreign import FOREIGN_UID, need_root, run_as
from tests.support import wait_until

pytest.importorskip("duckdb")
CODE = "'the owner''s code'"
#: Evals through the flipping link. Before the change, about 1 in 50 reached the attacker.
TRIES = 200


@pytest.fixture
def flipper(make_agent) -> Iterator[tuple[object, str, dict]]:
    """(the real agent, the attacker's dir, {"received": text} once the attacker is done)."""
    need_root()
    agent = make_agent()
    dir_ = f"/tmp/probe-flip-{uuid.uuid4().hex[:8]}"
    link = os.path.join(dir_, f"{os.getpid()}.sock")
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(
        received=run_as(FOREIGN_UID, flip, dir_, link, agent.unix_path, 30, timeout=60)))
    t.start()
    wait_until(lambda: os.path.lexists(link), 10, "the attacker never made its link")
    try:
        yield agent, dir_, out
    finally:
        t.join(65)
        shutil.rmtree(dir_, ignore_errors=True)
        shutil.rmtree(dir_ + "-evil", ignore_errors=True)


def test_a_flipped_socket_link_gets_zero_sends(flipper, capsys, monkeypatch):
    agent, dir_, seen = flipper
    link = os.path.join(dir_, f"{os.getpid()}.sock")
    codes = []
    # WHEN the operator evals through the flipping link, named as a socket path (the race
    # window between a check of the file and the connect is short: many tries)
    for _ in range(TRIES):
        codes.append(main([f"unix:{link}", "eval", CODE]))
    err = capsys.readouterr().err
    # AND with the attacker's dir as the run dir: the default target, and `probe PID`
    monkeypatch.setenv("PROBE_RUN_DIR", dir_)
    main(["--timeout", "2", "eval", CODE])
    capsys.readouterr()
    pid_code = main([str(os.getpid()), "eval", CODE])
    err2 = capsys.readouterr().err
    open(dir_ + "-evil/stop", "w").close()
    # THEN the attacker received nothing, whichever way the link pointed
    wait_until(lambda: "received" in seen, 70, "the attacker never reported")
    assert seen["received"] == "", seen["received"][:300]
    # AND each socket eval either reached the real agent or was refused by the server's uid
    assert set(codes) <= {0, 1}, err
    if 1 in codes:
        assert f"served by uid {FOREIGN_UID}" in err
    # AND the attacker's run dir is not looked into, and the CLI says why
    assert pid_code != 0 and f"belongs to uid {FOREIGN_UID}" in err2, err2
