"""Target parsing, --rank lists, `probe ENDPOINT CMD` rewriting, default target (no server)."""

from __future__ import annotations

import os

import pytest

from probe_cli.errors import EXIT_USAGE, NoAgentError, UsageProblemError
from probe_cli.main import _value_options, cli
from probe_cli.transport.targets import (
    Endpoint,
    default_endpoint,
    looks_like_endpoint,
    parse_endpoint,
    parse_endpoints,
    parse_rank_list,
    read_hostfile,
    rewrite_endpoint_argv,
)

COMMANDS = ["backtrace", "query", "eval", "info"]
VALUE_OPTS = ["-t", "--target", "--rank", "--timeout", "--token", "--hostfile"]


@pytest.mark.parametrize(
    ("text", "url"),
    [
        ("127.0.0.1:9700", "http://127.0.0.1:9700"),
        ("node-3.cluster:9701", "http://node-3.cluster:9701"),
        ("[::1]:9700", "http://[::1]:9700"),
        ("http://10.0.0.1:9700/", "http://10.0.0.1:9700"),
        ("https://probe.example/rank0", "https://probe.example/rank0"),
    ],
    ids=["ipv4", "hostname", "ipv6", "url-trailing-slash", "https-path"],
)
def test_tcp_endpoints(text, url):
    assert parse_endpoint(text, "/nonexistent") == Endpoint(url)


def test_pid_endpoint_uses_the_run_dir_socket(tmp_path):
    # GIVEN an agent socket for this process's PID in the run dir
    sock = tmp_path / f"{os.getpid()}.sock"
    sock.touch()
    # WHEN the PID is parsed
    ep = parse_endpoint(str(os.getpid()), str(tmp_path))
    # THEN it is that unix socket, reached as http://localhost
    assert ep == Endpoint("http://localhost", uds=str(sock), pid=os.getpid())
    assert ep.label == f"unix:{sock}"


def test_pid_without_socket_says_no_agent(tmp_path):
    with pytest.raises(NoAgentError) as e:
        parse_endpoint(str(os.getpid()), str(tmp_path))
    assert e.value.message.startswith(f"no probe agent for PID {os.getpid()}")
    assert "PROBE=1" in e.value.help_text and "probe ps" in e.value.help_text


def test_pid_of_no_process(tmp_path):
    with pytest.raises(NoAgentError, match="no process with PID 4194303"):
        parse_endpoint("4194303", str(tmp_path))


def test_garbage_target_is_a_usage_error():
    with pytest.raises(UsageProblemError) as e:
        parse_endpoint("not a target", "/x")
    assert e.value.exit_code == EXIT_USAGE


def test_endpoints_comma_separated_repeated_and_deduplicated():
    eps = parse_endpoints(["a:1,b:2", "a:1", "c:3"], "/x")
    assert [e.base_url for e in eps] == ["http://a:1", "http://b:2", "http://c:3"]


def test_hostfile_skips_comments_and_blanks(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("# job 42\nnode0:9700\n\nnode1:9700  # second node\n")
    assert read_hostfile(str(f)) == ["node0:9700", "node1:9700"]


@pytest.mark.parametrize(
    ("text", "ranks"),
    [("0,3", [0, 3]), ("5-7,1", [1, 5, 6, 7]), ("0–2", [0, 1, 2]), ("3,3", [3])],
    ids=["list", "range", "en-dash", "dupe"],
)
def test_rank_lists(text, ranks):
    assert parse_rank_list(text) == ranks


@pytest.mark.parametrize("text", ["x", "3-1", "-1", "1-"], ids=["word", "backwards", "neg", "open"])
def test_bad_rank_lists(text):
    with pytest.raises(UsageProblemError):
        parse_rank_list(text)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["1234", "backtrace"], ["-t", "1234", "backtrace"]),
        (["h:9700", "--json", "eval", "x"], ["-t", "h:9700", "--json", "eval", "x"]),
        (["--json", "h:1,h:2", "info"], ["--json", "-t", "h:1,h:2", "info"]),
        (["-t", "h:1", "query", "1"], ["-t", "h:1", "query", "1"]),
        (["--timeout", "3", "info"], ["--timeout", "3", "info"]),
        (["info"], ["info"]),
        (["http://h:1", "info"], ["-t", "http://h:1", "info"]),
        (["bogus", "info"], ["bogus", "info"]),
    ],
    ids=["pid", "hostport-then-options", "list-after-flag", "explicit-t", "value-option",
         "command-only", "url", "not-an-endpoint"],
)
def test_rewrite_endpoint_argv(argv, expected):
    assert rewrite_endpoint_argv(argv, COMMANDS, VALUE_OPTS) == expected


def test_value_options_come_from_the_group():
    opts = _value_options(cli)
    assert {"-t", "--target", "--rank", "--timeout", "--token", "--hostfile"} <= set(opts)
    assert "--json" not in opts


def test_looks_like_endpoint():
    assert looks_like_endpoint("1234") and looks_like_endpoint("a:1,b:2")
    assert not looks_like_endpoint("backtrace") and not looks_like_endpoint("a:1,")


def test_default_endpoint_is_the_only_socket(tmp_path):
    (tmp_path / "4242.sock").touch()
    ep, note = default_endpoint(str(tmp_path))
    assert ep.uds == str(tmp_path / "4242.sock") and ep.pid == 4242
    assert "only agent socket" in note


@pytest.mark.parametrize("n", [0, 2], ids=["none", "two"])
def test_default_endpoint_falls_back_to_9700(tmp_path, n):
    for i in range(n):
        (tmp_path / f"{i + 1}.sock").touch()
    ep, note = default_endpoint(str(tmp_path))
    assert ep == Endpoint("http://127.0.0.1:9700")
    assert "127.0.0.1:9700" in note and "pass -t" in note
