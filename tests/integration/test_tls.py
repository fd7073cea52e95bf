"""Optional TLS (issue 7): PROBE_TLS_CERT/PROBE_TLS_KEY on the agent, --cacert on the CLI.

A throwaway CA from trustme signs a certificate for 127.0.0.1; the agent serves HTTPS on its
TCP port (in-process uvicorn, and through the watchdog that owns the port by default), the unix
socket stays plain, and the CLI verifies the certificate or says what to pass.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from probe_agent.config import AgentConfig
from probe_agent.errors import ConfigError
from probe_cli.main import main

trustme = pytest.importorskip("trustme")


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, str]:
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    paths = {"ca": tmp_path / "ca.pem", "cert": tmp_path / "cert.pem", "key": tmp_path / "key.pem"}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    leaf.private_key_pem.write_to_path(str(paths["key"]))
    with open(paths["cert"], "wb") as f:
        for blob in leaf.cert_chain_pems:
            f.write(blob.bytes())
    other = trustme.CA()  # a CA that did not sign the agent's certificate
    paths["other_ca"] = tmp_path / "other.pem"
    other.cert_pem.write_to_path(str(paths["other_ca"]))
    return {k: str(v) for k, v in paths.items()}


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def port_of(agent) -> str:
    return agent.url.rsplit(":", 1)[1]


@pytest.mark.parametrize("watchdog", [False, True], ids=["in-process", "watchdog"])
def test_https_agent_and_a_verifying_cli(make_agent, run_dir, pki, capsys, watchdog):
    agent = make_agent(tls_cert=pki["cert"], tls_key=pki["key"], watchdog=watchdog)
    assert agent.url.startswith("https://127.0.0.1:")
    port = port_of(agent)

    # --cacert: HOST:PORT means https, the certificate is verified, eval works
    code, out, err = run(capsys, "--cacert", pki["ca"], "-t", f"127.0.0.1:{port}", "eval", "6*7")
    assert (code, out) == (0, "42\n"), err

    # the system store does not know our CA: a clear refusal that names --cacert
    code, out, err = run(capsys, "-t", f"https://127.0.0.1:{port}", "eval", "1")
    assert code == 1 and out == ""
    assert "certificate" in err and "--cacert" in err

    # a CA that did not sign it is refused the same way
    code, _, err = run(capsys, "--cacert", pki["other_ca"], "-t", f"127.0.0.1:{port}", "info")
    assert code == 1 and "not trusted" in err

    # plain HTTP to the TLS port: the hint says to use https
    code, _, err = run(capsys, "-t", f"127.0.0.1:{port}", "--timeout", "3", "info")
    assert code == 1 and "https://" in err

    # the unix socket stays plain HTTP (the kernel checks the peer's uid there)
    code, out, err = run(capsys, "--run-dir", run_dir, str(os.getpid()), "eval", "2+2")
    assert (code, out) == (0, "4\n"), err


def test_plain_agent_with_https_says_it_is_plain(agent, pki, capsys):
    port = port_of(agent)
    code, _, err = run(capsys, "-t", f"https://127.0.0.1:{port}", "--cacert", pki["ca"], "info")
    assert code == 1 and "plain HTTP" in err


def test_unreadable_cacert_is_a_usage_error(pki, capsys, tmp_path):
    code, _, err = run(capsys, "--cacert", str(tmp_path / "missing.pem"), "-t", "127.0.0.1:1",
                       "info")
    assert code == 2 and "--cacert" in err


def test_tls_config_is_validated_at_start(pki, tmp_path):
    with pytest.raises(ConfigError, match="PROBE_TLS_KEY"):
        AgentConfig(tls_cert=pki["cert"])
    with pytest.raises(ConfigError, match="PROBE_TLS_CERT=.*no such file"):
        AgentConfig(tls_cert=str(tmp_path / "nope.pem"), tls_key=pki["key"])
    with pytest.raises(ConfigError, match="cannot be loaded"):
        AgentConfig(tls_cert=pki["cert"], tls_key=pki["ca"])  # not the matching key
    env = {"PROBE_TLS_CERT": os.path.relpath(pki["cert"]), "PROBE_TLS_KEY": pki["key"]}
    assert AgentConfig.from_env(env).tls_cert == pki["cert"]  # made absolute for the watchdog


def test_launch_makes_the_jobs_certificate_and_the_cli_pins_it(make_agent, tmp_path, capsys):
    """`probe launch --make-cert DIR` (probe_cli/commands/_certs.py): a CA of the job's own and
    a certificate for its nodes; the agent serves it, the CLI verifies it with --cacert."""
    import subprocess
    import sys

    from tests.support import python_env

    pki = tmp_path / "pki"
    # WHEN the operator launches a command with --make-cert (`env` shows what the ranks get)
    done = subprocess.run(
        [sys.executable, "-m", "probe_cli", "launch", "--make-cert", str(pki), "--cert-host",
         "127.0.0.1", "--", "env"], capture_output=True, text=True, env=python_env(),
        timeout=60)
    assert done.returncode == 0, done.stderr
    env = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    # THEN the ranks get the certificate and key, and the operator the --cacert to pass
    assert env["PROBE_TLS_CERT"] == str(pki / "cert.pem")
    assert env["PROBE_TLS_KEY"] == str(pki / "key.pem")
    assert f"--cacert {pki / 'ca.pem'}" in done.stderr
    assert (pki / "key.pem").stat().st_mode & 0o777 == 0o600
    # AND an agent serving it is verified through the job's CA, and only through it
    agent = make_agent(tls_cert=env["PROBE_TLS_CERT"], tls_key=env["PROBE_TLS_KEY"])
    port = port_of(agent)
    code, out, err = run(capsys, "--cacert", str(pki / "ca.pem"), "-t", f"127.0.0.1:{port}",
                         "eval", "6*7")
    assert (code, out) == (0, "42\n"), err
    code, _, err = run(capsys, "-t", f"https://127.0.0.1:{port}", "eval", "1")
    assert code == 1 and "--cacert" in err
    # AND a second node's launch in the same shared directory uses the same files
    again = subprocess.run(
        [sys.executable, "-m", "probe_cli", "launch", "--make-cert", str(pki), "--", "true"],
        capture_output=True, text=True, env=python_env(), timeout=60)
    assert again.returncode == 0 and "using the job's TLS certificate" in again.stderr
