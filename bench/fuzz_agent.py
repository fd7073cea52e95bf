"""Fuzz the agent's served OpenAPI spec with schemathesis while a training job runs.

Starts tests/programs/toy_train.py with the agent (once without a token, once with one), runs
`schemathesis run <url>/openapi.json --checks not_a_server_error`, then sends every POST route
the bodies schemathesis does not make (issue 20, item 7): lone surrogates (``"\udcff"`` is
valid JSON, not text) in every string field, a 100k-deep JSON array, a 20 MB body, invalid
UTF-8 and a body that is not JSON, and checks that
- no response had a 5xx status (schemathesis exits non-zero otherwise), and
- the training process kept stepping throughout (trainer.current_step before and after).

    python bench/fuzz_agent.py [--max-examples 100]
Exit code 0 when both runs are clean.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "tests" / "programs" / "toy_train.py"


def hostile_bodies(spec: dict) -> list[tuple[str, bytes]]:
    """(name, body) for one POST route of ``spec``: what a JSON generator never makes."""
    out = [("deep-json", b"[" * 100_000 + b"]" * 100_000),
           ("deep-object", b'{"a":' * 50_000 + b"1" + b"}" * 50_000),
           ("huge-20MB", b'{"x": "' + b"a" * (20 << 20) + b'"}'),
           ("invalid-utf8", b'{"sql": "\xff\xfe", "code": "\xc3\x28"}'),
           ("not-json", b"SELECT 1"),
           ("surrogate-key", b'{"\\udcff": 1}')]
    fields = spec.get("properties", {})
    strings = [k for k, v in fields.items()
               if v.get("type") == "string" or any(a.get("type") == "string"
                                                   for a in v.get("anyOf", []))]
    if strings:  # json.dumps writes a lone surrogate as the escape "\udcff": valid JSON
        out.append(("lone-surrogate", json.dumps({k: "\udcff" for k in strings}).encode()))
        out.append(("high-surrogate", json.dumps({k: "x\ud800y" for k in strings}).encode()))
    return out


def send_hostile(url: str, headers: dict[str, str]) -> list[str]:
    """Send ``hostile_bodies`` to every POST route; the 5xx answers, as lines."""
    spec = httpx.get(f"{url}/openapi.json", headers=headers, timeout=30).json()
    failures = []
    for path, ops in spec["paths"].items():
        if "post" not in ops or "{" in path:
            continue
        body_spec = (ops["post"].get("requestBody", {}).get("content", {})
                     .get("application/json", {}).get("schema", {}))
        if "$ref" in body_spec:
            body_spec = spec["components"]["schemas"][body_spec["$ref"].split("/")[-1]]
        for name, body in hostile_bodies(body_spec):
            try:
                r = httpx.post(url + path, content=body, timeout=60, headers={
                    **headers, "content-type": "application/json"})
            except httpx.HTTPError as e:
                failures.append(f"POST {path} {name}: {type(e).__name__}: {e}")
                continue
            if r.status_code >= 500:
                failures.append(f"POST {path} {name}: {r.status_code} {r.text[:200]}")
    return failures


def run_once(token: str | None, max_examples: int, seed: int = 1) -> tuple[bool, str]:
    with tempfile.TemporaryDirectory(prefix="probe-fuzz-") as d:
        tmp = Path(d)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PROBE")}
        env.update(PYTHONPATH=str(ROOT), PROBE="1", PROBE_PORT="0", PROBE_WATCHDOG="0",
                   PROBE_RUN_DIR=str(tmp / "run"), PROBE_EVAL_TIMEOUT_S="2",
                   # no serving budget (as the agent fixtures): a thousand fuzzed requests in a
                   # row used it up and queued a plain query past the client's 30 s timeout
                   PROBE_SERVE_CPU="1")
        if token:
            env["PROBE_TOKEN"] = token
        # The output goes to a file, not a pipe nobody reads (a full pipe would stall the
        # process at its next log line), and cwd is the temp dir: fuzzed checkpoint actions
        # write to whatever relative path the fuzzer made up.
        log_path = tmp / "train.log"
        log_file = open(log_path, "w")  # noqa: SIM115 - closed in finally
        proc = subprocess.Popen(
            [sys.executable, str(PROGRAM), "--ready-dir", str(tmp),
             "--stop-file", str(tmp / "stop")],
            env=env, stdout=log_file, stderr=subprocess.STDOUT, text=True, cwd=tmp,
            start_new_session=True,
        )

        def output() -> str:
            log_file.flush()
            return log_path.read_text(errors="replace")[-4000:]

        try:
            deadline = time.monotonic() + 60
            while not (tmp / "rank0.json").exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    return False, f"training did not start: {output()}"
                time.sleep(0.05)
            url = json.loads((tmp / "rank0.json").read_text())["url"]
            headers = {"Authorization": f"Bearer {token}"} if token else {}

            def step() -> int:
                try:
                    r = httpx.post(f"{url}/v1/eval", json={"code": "trainer.current_step"},
                                   headers=headers, timeout=30)
                except httpx.HTTPError as e:
                    raise RuntimeError(
                        f"agent unreachable ({e}); training alive={proc.poll() is None} "
                        f"exit={proc.returncode}; its output:\n{output()}") from None
                return int(r.json()["result"])

            before = step()
            local = Path(sys.executable).with_name("schemathesis")
            exe = str(local) if local.exists() else shutil.which("schemathesis") or "schemathesis"
            cmd = [exe, "run", f"{url}/openapi.json",
                   "--checks", "not_a_server_error", "--max-examples", str(max_examples),
                   "--workers", "1", "--request-timeout", "60", "--seed", str(seed)]
            if token:
                cmd += ["-H", f"Authorization: Bearer {token}"]
            # 60 s per request: SQL runs at nice 10 and its deadline counts its own CPU
            # time (at most 4 x PROBE_QUERY_TIMEOUT_MS of wall time, 40 s), so on a saturated
            # machine a query can take that long to answer its 408; it must not read as a
            # network error
            fz = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            hostile = send_hostile(url, headers) if proc.poll() is None else []
            alive = proc.poll() is None
            if not alive:
                # Report why the training process ended: that is the finding, not the ConnectError.
                return False, (f"token={'yes' if token else 'no'}: training process exited "
                               f"{proc.returncode} during fuzzing:\n{output()}\n"
                               f"schemathesis said:\n{fz.stdout[-3000:]}")
            after = step()
            summary = [ln for ln in fz.stdout.splitlines() if "generated" in ln or "passed" in ln]
            ok = fz.returncode == 0 and alive and after > before and not hostile
            return ok, (
                f"token={'yes' if token else 'no'}: schemathesis exit {fz.returncode} "
                f"({'; '.join(s.strip() for s in summary[-2:])}); hostile bodies: "
                f"{len(hostile)} 5xx; training steps {before} -> {after}, "
                f"alive={alive}" + ("" if fz.returncode == 0 else "\n" + fz.stdout[-3000:])
                + "".join("\n  " + h for h in hostile)
            )
        finally:
            (tmp / "stop").touch()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait(5)
            log_file.close()


def _exit_on_term(signum: int, _frame: object) -> None:
    # SIGTERM (a test's timeout) must end this run like an error, so that subprocess.run kills
    # schemathesis and run_once's finally stops the training job: a bare SIGTERM left both
    # running, a paused job among them, long after the test had failed.
    raise SystemExit(128 + signum)


def main() -> int:
    signal.signal(signal.SIGTERM, _exit_on_term)
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-examples", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    results = []
    for tok in (None, "fuzz-token"):
        try:
            results.append(run_once(tok, args.max_examples, args.seed))
        except RuntimeError as e:  # the agent became unreachable: report, do not traceback
            results.append((False, f"token={'yes' if tok else 'no'}: {e}"))
    for _, line in results:
        print(line)
    return 0 if all(ok for ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
