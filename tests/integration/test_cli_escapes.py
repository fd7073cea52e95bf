"""Text from a job is data, not terminal control (probe_cli/transport/untrusted_text.py).

A stranger (a real uid-65534 process) sends refused requests whose paths hold OSC/CSI
sequences; the agent audits them in python.audit. Before, the owner's `probe query` printed
them raw: a window title, a cleared screen, a clipboard write (OSC 52). Eval output, errors and
thread names in backtraces carry them the same way.
"""

from __future__ import annotations

import threading

import pytest

from probe_cli.main import main
from tests.foreign import FOREIGN_UID, http_request, need_root, run_as
from tests.support import wait_until

pytest.importorskip("duckdb")
OSC_TITLE = "\x1b]0;pwned\x07"
CLEAR = "\x1b[2J"
CLIPBOARD = "\x1b]52;c;cm0gLXJmIH4K\x07"
C1_CSI = "\x9b31m"


def _no_raw_controls(text: str) -> bool:
    return not any(c in text for c in ("\x1b", "\x07", "\x9b", "\r"))


def test_refused_paths_from_another_uid_print_escaped(make_agent, capsys):
    need_root()
    agent = make_agent()
    port = agent.tcp_port
    # GIVEN uid 65534's refused requests, whose paths hold escape sequences, in the audit rows
    path = "/v1/eval%1b%5d0%3bpwned%07%1b%5b2J%1b%5d52%3bc%3bcm0gLXJmIH4K%07"
    status = run_as(FOREIGN_UID, lambda: http_request("127.0.0.1", port, "POST", path, {})[0])
    assert status == 403
    sql = "SELECT code FROM python.audit WHERE code LIKE '%pwned%'"
    wait_until(lambda: main([agent.url.removeprefix("http://"), "--json", "query", sql]) == 0
               and "pwned" in capsys.readouterr().out, 15, "the refusal was never audited")
    # WHEN the owner reads them as a table
    assert main([agent.url.removeprefix("http://"), "query", sql]) == 0
    out = capsys.readouterr().out
    # THEN the sequences are shown, escaped, and none reaches the terminal
    assert "pwned" in out and "\\x1b]0;pwned\\x07" in out, out
    assert _no_raw_controls(out), repr(out)
    # AND --raw prints them as they are, for whoever asks
    assert main([agent.url.removeprefix("http://"), "--raw", "query", sql]) == 0
    assert "\x1b]0;pwned\x07" in capsys.readouterr().out


def test_eval_output_errors_and_thread_names_print_escaped(make_agent, capsys):
    agent = make_agent()
    target = agent.url.removeprefix("http://")
    # eval output (print and the value)
    code = f"print({OSC_TITLE!r} + {CLEAR!r}); {CLIPBOARD!r} + {C1_CSI!r}"
    assert main([target, "eval", code]) == 0
    out, err = capsys.readouterr()
    assert "\\x1b]0;pwned\\x07" in out + err and "\\x1b]52;c;" in out + err, out + err
    assert _no_raw_controls(out + err), repr(out + err)
    # an error message
    assert main([target, "eval", f"raise ValueError({OSC_TITLE!r} + '\\r' + {CLEAR!r})"]) != 0
    out, err = capsys.readouterr()
    assert "ValueError" in out + err and "\\x1b[2J" in out + err
    assert _no_raw_controls(out + err), repr(out + err)
    # a thread name in a backtrace
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, name=f"loader{OSC_TITLE}{C1_CSI}", daemon=True)
    t.start()
    try:
        assert main([target, "backtrace", "--all"]) == 0
        out, err = capsys.readouterr()
    finally:
        stop.set()
        t.join(5)
    assert "loader\\x1b]0;pwned\\x07\\x9b31m" in out, out[-2000:]
    assert _no_raw_controls(out + err), repr(out + err)


def test_another_users_command_line_prints_escaped_in_ps(capsys):
    """`probe ps` as root lists every user's Python processes, command lines included: a
    stranger chooses those bytes."""
    import subprocess

    need_root()
    # GIVEN a Python process of uid 65534 whose argv carries a window-title sequence
    proc = subprocess.Popen(["/usr/bin/python3", "-c", "import time; time.sleep(60)",
                             f"{OSC_TITLE}{CLEAR}"], stdin=subprocess.DEVNULL,
                            user=FOREIGN_UID, group=FOREIGN_UID, extra_groups=[])

    def started() -> bool:
        with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
            return b"pwned" in f.read()

    try:
        wait_until(started, 10, "the stranger's process never started")
        # WHEN the owner (root) lists processes
        assert main(["ps", "--all"]) in (0, 1)  # --all: a Python process that is no agent
        out = capsys.readouterr().out
    finally:
        proc.kill()
        proc.wait(10)
    # THEN its command line is there, escaped (and cut to the column's width)
    line = next((ln for ln in out.splitlines() if str(proc.pid) in ln), "")
    assert "\\x1b]0;pwn" in line, out
    assert _no_raw_controls(out), repr(out)
