"""`probe … | head` ends quietly (issue 15): no BrokenPipeError traceback when the reader of
stdout goes away, through the real console-script entry point and a real pipe."""

from __future__ import annotations

import subprocess
import sys

from tests.unit.cli_server import canned_job

#: Far more than a pipe buffer (64 KiB), so the CLI is still writing when the reader leaves.
BIG = "\n".join(f"line {i}" for i in range(40_000))


def test_output_into_a_closed_pipe_ends_without_traceback():
    with canned_job(1, eval_result=BIG) as (agent,):
        # GIVEN `probe eval` whose answer is ~400 KB, read by a consumer that stops at once
        code = "import sys; from probe_cli.__main__ import main; sys.exit(main())"
        proc = subprocess.Popen(
            [sys.executable, "-c", code, "-t", agent.address, "eval", "x"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        first = proc.stdout.readline()
        # WHEN the reader goes away (what `head -1` does)
        proc.stdout.close()
        with proc.stderr:
            err = proc.stderr.read().decode()
        rc = proc.wait(timeout=30)
    # THEN the CLI ends quietly, with the pipe-closed exit status and nothing on stderr
    assert first.strip()
    assert "BrokenPipeError" not in err and "Traceback" not in err, err
    assert rc == 1, err
