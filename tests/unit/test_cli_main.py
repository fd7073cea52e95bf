"""The `probe` command end to end against canned agents: output shapes and exit codes.

``main(argv)`` in-process for most cases; a few ``python -m probe_cli`` subprocesses pin the real
exit codes, and one pty test pins the TTY colour rule.
"""

from __future__ import annotations

import io
import json
import os
import pty
import subprocess
import sys

import pytest

from probe_cli.main import _progress_for, decide_colour, main
from tests.support import python_env
from tests.unit.cli_server import canned_job, closed_port, stack


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def probe_subprocess(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "probe_cli", *argv], capture_output=True,
                          text=True, timeout=60, env=python_env(**env))


def test_backtrace_groups_ranks_and_names_the_outlier(capsys):
    # GIVEN 4 ranks where rank 2 is in the DataLoader and the rest in all_reduce
    dl = stack("__next__", "train")
    with canned_job(4, frames=stack("all_reduce", "train"), overrides={2: {"frames": dl}}) as a:
        # WHEN `probe HOST:PORT backtrace`
        code, out, err = run(capsys, a[0].address, "backtrace")
    # THEN exit 0, the outlier first, the majority in compact range form
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "rank 2 (1/4 ranks) main thread:"
    assert lines[1] == "    __next__ (train.py:10)"
    assert "ranks 0,1,3 (3/4 ranks) main thread:" in lines
    assert err == ""


def test_backtrace_all_prints_every_rank_with_headers(capsys):
    with canned_job(2) as a:
        code, out, _ = run(capsys, "-t", a[1].address, "backtrace", "--all")
    assert code == 0
    assert f"Rank 0 (node0:1000) {a[0].url}" in out.splitlines()
    assert "Thread 101 (MainThread) [main]" in out


def test_eval_partial_failure_exits_3_with_tracebacks_and_summary(capsys):
    # GIVEN rank 1 of 3 is silent
    with canned_job(3, overrides={1: {"delay": 30}}) as a:
        # WHEN eval reaches every rank with a short timeout
        code, out, err = run(capsys, a[0].address, "--timeout", "0.5", "eval", "1+1")
    # THEN the answers are printed, grouped, and the silent rank is on stderr with exit 3
    assert code == 3
    assert out.splitlines() == ["ranks 0,2:", "2"]
    assert err.splitlines()[0] == "probe: 2/3 ranks answered; silent: 1 (timeout 0.5 s)"
    assert "hint: raise --timeout" in err


def test_eval_error_everywhere_exits_1_with_the_traceback(capsys):
    with canned_job(2) as a:
        code, out, err = run(capsys, a[0].address, "eval", "1/0")
    assert code == 1 and out == ""
    assert err.splitlines()[0] == "ranks 0,1:"
    assert "ZeroDivisionError: division by zero" in err
    # every rank answered, with an error: not "no rank answered"
    assert "probe: every rank answered with an error (2); failed: 0,1 (HTTP 400: " \
        "ZeroDivisionError" in err, err
    assert "no rank answered" not in err


def test_json_is_one_array_of_wire_bodies(capsys):
    with canned_job(3) as a:
        code, out, _ = run(capsys, a[2].address, "--json", "eval", "1+1")
    assert code == 0
    bodies = json.loads(out)
    assert [b["rank"] for b in bodies] == [0, 1, 2] and all(b["result"] == "2" for b in bodies)
    assert "\x1b[" not in out


def test_query_across_ranks_one_table_with_rank_column(capsys):
    with canned_job(2) as a:
        code, out, _ = run(capsys, a[0].address, "query", "SELECT 1")
    assert code == 0
    assert [line.split() for line in out.splitlines()] == [
        ["rank", "x", "name"], ["----", "-", "----"], ["0", "0", "r0"], ["1", "1", "r1"]]


def test_query_csv_and_output_file(capsys, tmp_path):
    with canned_job(2) as a:
        code, out, _ = run(capsys, a[0].address, "--csv", "query", "SELECT 1")
        assert code == 0 and out.splitlines() == ["rank,x,name", "0,0,r0", "1,1,r1"]
        target = tmp_path / "q.csv"
        code, out, err = run(capsys, a[0].address, "query", "SELECT 1", "--format", "csv",
                             "-o", str(target))
    assert code == 0 and out == "" and f"wrote {target}" in err
    assert target.read_text().splitlines()[0] == "rank,x,name"


def test_bad_sql_everywhere_shows_the_agents_message(capsys):
    with canned_job(2) as a:
        code, _, err = run(capsys, a[0].address, "query", "SELCT 1")
    assert code == 1
    assert 'failed: 0,1 (HTTP 400: Parser Error: syntax error at or near "SELCT")' in err


def test_wrong_token_exits_1_with_remediation(capsys):
    with canned_job(1, token="s3cret") as a:
        code, _, err = run(capsys, a[0].address, "--token", "nope", "info")
        assert code == 1
        assert "answered HTTP 401: wrong token" in err and "PROBE_TOKEN" in err
        code, out, _ = run(capsys, a[0].address, "--token", "s3cret", "info")
        assert code == 0 and "3.11.7" in out


def test_token_file(capsys, tmp_path):
    f = tmp_path / "token"
    f.write_text("s3cret\n")
    f.chmod(0o600)
    with canned_job(1, token="s3cret") as a:
        code, _, err = run(capsys, a[0].address, "--token-file", str(f), "info")
    assert code == 0, err


def test_global_options_work_after_the_subcommand(capsys):
    # GIVEN a 2-rank job; WHEN --rank, --json and --timeout come after the subcommand
    with canned_job(2) as a:
        code, out, _ = run(capsys, a[0].address, "query", "SELECT 1", "--rank", "1", "--json",
                           "--timeout=5")
        # THEN they apply as before it: rank 1 only, as JSON
        assert code == 0, out
        assert [b["rank"] for b in json.loads(out)] == [1]
        # AND a subcommand's own option of the same name is still its own (query --format csv)
        code, out, _ = run(capsys, a[0].address, "query", "SELECT 1", "--format", "csv",
                           "--rank", "0")
        assert code == 0 and out.splitlines() == ["rank,x,name", "0,0,r0"]


def test_a_rank_the_job_has_but_discovery_does_not_list_is_silent(capsys):
    """fsdp2 CI: `probe slow` asked before rank 1 registered got one rank's answer, printed
    "only 1 of 2 ranks found" and still exited 0."""
    with canned_job(1) as a:
        a[0].world_size = 2  # GIVEN rank 0 answers for a 2-rank job whose rank 1 is not listed
        # WHEN a command reaches the job through rank 0
        code, out, err = run(capsys, a[0].address, "eval", "1+1")
        # THEN rank 0's answer is printed, rank 1 is reported, and the exit code is partial
        assert code == 3, err
        assert out.strip() == "2"
        assert "1/2 ranks answered" in err and "failed: 1 (not registered" in err, err
        # AND asking rank 0 alone is a complete answer
        assert run(capsys, a[0].address, "--rank", "0", "eval", "1+1")[0] == 0


def test_unknown_rank_is_a_usage_error(capsys):
    with canned_job(2) as a:
        code, _, err = run(capsys, a[0].address, "--rank", "0,9", "info")
    assert code == 2
    assert err.splitlines()[0] == "probe: rank 9 not in job (ranks 0,1)"


def test_info_table(capsys):
    with canned_job(2) as a:
        code, out, _ = run(capsys, a[0].address, "info")
    assert code == 0
    assert out.splitlines()[0].split() == ["rank", "host", "pid", "python", "torch", "version",
                                           "access", "hot_path", "uptime"]
    # a canned agent from before the hot path was reported shows '-' for it
    assert out.splitlines()[2].split() == ["0", "node0", "1000", "3.11.7", "2.13.0", "0.1.0",
                                           "-", "-", "1m15s"]


def test_arrow_format_needs_an_output_file(capsys):
    code, _, err = run(capsys, "-t", "127.0.0.1:1", "query", "SELECT 1", "--format", "arrow")
    assert code == 2 and "add -o FILE" in err


@pytest.mark.parametrize(
    ("environ", "tty", "colour"),
    [({}, True, True), ({}, False, False), ({"NO_COLOR": "1"}, True, False),
     ({"FORCE_COLOR": "1"}, False, True), ({"NO_COLOR": "1", "FORCE_COLOR": "1"}, True, False)],
    ids=["tty", "pipe", "no-color", "force-color", "no-color-wins"],
)
def test_decide_colour(environ, tty, colour):
    class Stream(io.StringIO):
        def isatty(self) -> bool:
            return tty

    assert decide_colour(environ, Stream()) is colour


def test_progress_only_on_a_tty():
    class TTY(io.StringIO):
        def isatty(self) -> bool:
            return True

    pipe, tty = io.StringIO(), TTY()
    for stream in (pipe, tty):
        progress = _progress_for(stream)
        progress(12, 64)
        progress(64, 64)
    assert pipe.getvalue() == ""
    assert tty.getvalue() == "\ranswered 12/64\r\x1b[K"


# -- real exit codes of `python -m probe_cli` ---------------------------------------------------


def test_subprocess_exit_codes():
    with canned_job(2, overrides={1: {"delay": 30}}) as a:
        ok = probe_subprocess(a[0].address, "--rank", "0", "info")
        partial = probe_subprocess(a[0].address, "--timeout", "0.5", "info")
    dead = probe_subprocess(f"127.0.0.1:{closed_port()}", "backtrace")
    usage = probe_subprocess("--no-such-option", "info")
    assert ok.returncode == 0, ok.stderr
    assert partial.returncode == 3, partial.stderr
    assert "1/2 ranks answered; silent: 1" in partial.stderr
    assert dead.returncode == 1 and "connection refused" in dead.stderr
    assert "PROBE=1" in dead.stderr and "probe ps" in dead.stderr, dead.stderr
    assert usage.returncode == 2


def test_unknown_pid_subprocess(tmp_path):
    r = probe_subprocess(str(os.getpid()), "backtrace", PROBE_RUN_DIR=str(tmp_path))
    assert r.returncode == 1
    assert r.stderr.startswith(f"probe: no probe agent for PID {os.getpid()}")
    assert "PROBE=1" in r.stderr


def test_colour_on_a_tty_only():
    """stdout a pty: colour; NO_COLOR or --no-color: none (memray's pty test)."""
    with canned_job(1) as a:
        outputs = []
        for extra_env, extra_args in (({}, ()), ({"NO_COLOR": "1"}, ()), ({}, ("--no-color",))):
            main_fd, child_fd = pty.openpty()
            proc = subprocess.Popen(
                [sys.executable, "-m", "probe_cli", a[0].address, *extra_args, "backtrace"],
                stdout=child_fd, stderr=subprocess.DEVNULL, env=python_env(**extra_env),
            )
            os.close(child_fd)
            chunks = []
            while True:
                try:
                    data = os.read(main_fd, 4096)
                except OSError:  # EIO: the child closed its end
                    break
                if not data:
                    break
                chunks.append(data)
            proc.wait(30)
            os.close(main_fd)
            outputs.append(b"".join(chunks).decode())
    coloured, no_color_env, no_color_flag = outputs
    assert "\x1b[" in coloured and "Rank 0" in coloured
    assert "\x1b[" not in no_color_env and "Rank 0" in no_color_env
    assert "\x1b[" not in no_color_flag


def test_cli_surface_is_pinned():
    """The options people's muscle memory (and the seed playbook) rely on; adding one is a
    decision, so it shows up here (torchtitan's test_no_new_cli_options)."""
    from probe_cli.main import cli

    group_opts = {o for p in cli.params for o in p.opts}
    assert group_opts == {"-t", "--target", "--hostfile", "--rank", "--json", "--csv",
                          "--timeout", "--token", "--token-file", "--cacert", "--run-dir",
                          "--no-color", "--raw", "--version"}
    assert {"backtrace", "query", "eval", "info"} <= set(cli.commands)
    opts = {name: {o for p in cli.commands[name].params for o in p.opts}
            for name in ("backtrace", "query", "ps")}
    assert {"--locals", "--native", "--all"} <= opts["backtrace"]
    assert {"--format", "-o", "--gather"} <= opts["query"]
    # issue 20 item 5: stale files hidden, swept on demand
    assert opts["ps"] == {"--clean", "--all"}
    # One word per window: --last looks back, --for looks ahead (--steps: a hidden alias)
    shown = {name: {o for p in cli.commands[name].params if not getattr(p, "hidden", False)
                    for o in p.opts}
             for name in ("steps", "memory", "slow", "trace", "doctor", "straggler", "profile")}
    assert all("--last" in shown[n] and "--steps" not in shown[n] for n in shown if n != "profile")
    assert "--for" in shown["profile"] and not {"--steps", "--last"} & shown["profile"]


def test_native_request_notes_when_the_route_has_no_native_frames(capsys):
    with canned_job(1, extra_backtrace={"native": False}) as a:
        code, out, err = run(capsys, a[0].address, "backtrace", "--native")
    assert code == 0 and "Rank 0" in out
    assert err.startswith("note: rank 0: no native frames")
