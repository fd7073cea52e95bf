"""Where to send requests: endpoint strings, hostfiles, --rank lists, and `probe ENDPOINT CMD`.

An endpoint is one of:

- ``HOST:PORT`` (``[::1]:9700`` for IPv6) -> ``http://HOST:PORT`` (``https://`` with --cacert);
- a URL, ``http://...`` or ``https://...``;
- a local PID (all digits) -> the agent's unix socket ``$PROBE_RUN_DIR/<pid>.sock``;
- a socket path (``unix:/path`` or a path ending in ``.sock``).

Pure functions except for the few that look at the run directory or at a PID.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from probe_protocol import runfiles
from probe_protocol.runfiles import RunFiles

from ..errors import NoAgentError, UsageProblemError

DEFAULT_TARGET = "127.0.0.1:9700"
_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+):(\d{1,5})$")
_URL = re.compile(r"^https?://[^\s/]+(/\S*)?$")


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One agent address. ``uds`` set means: connect to that unix socket, not TCP."""

    base_url: str
    uds: str | None = None
    pid: int | None = None
    postmortem: str | None = None
    """A post-mortem copy's directory (a job's, or one rank's): answered from its files."""
    this_machine_only: bool = False
    """Refuse the connection unless its server end is on this machine (guard.py): a rank learnt
    from a tokenless job's rank list, which cannot have a rank elsewhere worth trusting."""

    @property
    def label(self) -> str:
        """How the operator sees it in headers and errors."""
        return f"unix:{self.uds}" if self.uds else self.base_url


def default_run_dir(environ: Mapping[str, str] | None = None) -> str:
    """The agents' socket directory: ``$PROBE_RUN_DIR`` or ``/tmp/probe-<uid>``."""
    return runfiles.run_dir(environ)


def run_dir_problem(path: str) -> str | None:
    """Why the run dir ``path`` must not be trusted, or None. Any local user can create
    ``/tmp/probe-<uid>`` for every uid, and fill it with symlinks to sockets of their own: the
    CLI uses a run dir only if it is a real directory (not a symlink), ours, and 0700."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None  # nothing there: nothing found in it either
    except OSError as e:
        return f"run dir {path}: {e.strerror}"
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return f"run dir {path} is not a directory (a symlink or a file)"
    if st.st_uid != os.getuid():
        return (f"run dir {path} belongs to uid {st.st_uid}, not to you (uid {os.getuid()}): "
                "another user may have made it first")
    if stat.S_IMODE(st.st_mode) != 0o700:
        return (f"run dir {path} has mode {stat.S_IMODE(st.st_mode):o}, not 700: others could "
                f"plant sockets in it (chmod 700 {path}, if it is yours)")
    return None


def local_run_dirs(run_dir: str) -> list[str]:
    """``run_dir``, then where an agent goes when its run dir cannot be used
    (probe_protocol/runfiles.py): ``$XDG_RUNTIME_DIR/probe`` and private ``/tmp/probe-<uid>-*``
    directories. Only those ``run_dir_problem`` finds nothing wrong with (the agent makes its
    own 0700)."""
    cands = [run_dir, *runfiles.fallback_dirs()]
    try:
        prefix = runfiles.private_prefix()
        cands += sorted(os.path.join("/tmp", n) for n in os.listdir("/tmp")
                        if n.startswith(prefix))
    except OSError:
        pass
    return [d for i, d in enumerate(cands)
            if os.path.isdir(d) and run_dir_problem(d) is None and d not in cands[:i]]


def socket_of(pid: int, run_dir: str) -> str | None:
    """The unix socket of ``pid``'s agent, in ``run_dir`` or a fallback run dir."""
    for d in local_run_dirs(run_dir):
        path = RunFiles(d, pid).sock
        if os.path.exists(path):
            return path
    return None


def looks_like_endpoint(text: str) -> bool:
    """True for what `probe ENDPOINT COMMAND` accepts (comma-separated lists too)."""
    parts = [p.strip() for p in text.split(",")]
    return bool(parts) and all(p and _kind(p) is not None for p in parts)


def _kind(text: str) -> str | None:
    if text.isdigit():
        return "pid"
    if _URL.match(text):
        return "url"
    if text.startswith("unix:") or (text.endswith(".sock") and "/" in text):
        return "uds"
    m = _HOST_PORT.match(text)
    if m and 0 < int(m.group(2)) < 65536:
        return "hostport"
    return None


def parse_endpoint(
    text: str, run_dir: str, *, check_pid: bool = True, scheme: str = "http"
) -> Endpoint:
    """Turn one endpoint string into an Endpoint.

    Args:
        text: HOST:PORT, a URL, a PID, or a socket path (see the module docstring).
        run_dir: where ``<pid>.sock`` lives for a PID.
        check_pid: look for the PID's socket now, so a wrong PID fails before any request with
            "no probe agent for PID ..." instead of a connection error.
        scheme: for HOST:PORT; ``https`` when the operator gave --cacert.
    """
    text = text.strip()
    kind = _kind(text)
    if kind is None and os.path.isdir(text):
        from .postmortem import PREFIX, find_job

        job = find_job(text)  # a usage error when it is no copy, or not ours
        return Endpoint(PREFIX + job.path, postmortem=job.path)
    if kind == "pid":
        pid = int(text)
        found = socket_of(pid, run_dir)
        why = run_dir_problem(run_dir)
        if found is None and why is not None:
            raise NoAgentError(f"not looking for PID {pid}'s agent in {run_dir}: {why}",
                               help_text="set PROBE_RUN_DIR to the job's own run dir, or remove "
                                         "the one you do not own")
        path = found or RunFiles(run_dir, pid).sock
        if check_pid and not os.path.exists(path):
            raise _no_agent(pid, path)
        return Endpoint("http://localhost", uds=path, pid=pid)
    if kind == "uds":
        return Endpoint("http://localhost", uds=text.removeprefix("unix:"))
    if kind == "url":
        return Endpoint(text.rstrip("/"))
    if kind == "hostport":
        return Endpoint(f"{scheme}://{text}")
    raise UsageProblemError(
        f"cannot use {text!r} as a target",
        help_text="give HOST:PORT, http(s)://HOST:PORT, a local PID, or unix:/path/to/agent.sock",
    )


def _no_agent(pid: int, path: str) -> NoAgentError:
    try:
        os.kill(pid, 0)  # probe before guessing (memray's attach does the same)
    except ProcessLookupError:
        return NoAgentError(f"no process with PID {pid}", help_text="check the PID (`probe ps`)")
    except PermissionError:
        pass  # it exists, owned by someone else
    return NoAgentError(f"no probe agent for PID {pid} (no socket at {path})")


def parse_endpoints(values: Iterable[str], run_dir: str, scheme: str = "http") -> list[Endpoint]:
    """All -t values (each possibly comma-separated), deduplicated in order."""
    out: list[Endpoint] = []
    for value in values:
        for part in value.split(","):
            if part.strip():
                ep = parse_endpoint(part, run_dir, scheme=scheme)
                if ep not in out:
                    out.append(ep)
    return out


def read_hostfile(path: str) -> list[str]:
    """One HOST:PORT per line; blank lines and ``#`` comments are skipped."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise UsageProblemError(f"cannot read hostfile {path}: {e.strerror}") from e
    return [s for s in (line.split("#", 1)[0].strip() for line in lines) if s]


def default_endpoint(run_dir: str, scheme: str = "http") -> tuple[Endpoint, str]:
    """The target when none was given, and a note saying how it was chosen (for errors).

    Exactly one agent socket in the run dir: that agent. The agents of exactly one job (their
    ``<pid>.json`` records, grouped by the job's rendezvous): its lowest rank's socket, which
    reaches every rank. Several jobs: ``UsageProblemError`` listing them, with the ``-t`` that
    picks each (a guess would probe the wrong job). Otherwise ``127.0.0.1:9700``. A run dir
    that is not ours, not 0700 or a symlink is not looked into, and the note says why.
    """
    why = run_dir_problem(run_dir)
    socks = [] if why else runfiles.agent_sockets(run_dir)
    if len(socks) == 1:
        path = os.path.join(run_dir, socks[0])
        pid = runfiles.pid_of(socks[0])
        note = f"no target given; using the only agent socket in {run_dir} ({socks[0]})"
        return Endpoint("http://localhost", uds=path, pid=pid), note
    jobs = local_jobs(run_dir, socks)
    if len(jobs) == 1:
        (rank, pid), *_ = jobs[0]
        note = (f"no target given; using rank {rank}'s socket ({pid}.sock) of the only job in "
                f"{run_dir} ({len(jobs[0])} agents)")
        return Endpoint("http://localhost", uds=RunFiles(run_dir, pid).sock, pid=pid), note
    if len(jobs) > 1:
        lines = [f"job {i + 1}: rank{'s' if len(j) > 1 else ''} "
                 f"{','.join(str(r) for r, _ in j)} (pids {','.join(str(p) for _, p in j)}): "
                 f"probe -t {j[0][1]} COMMAND" for i, j in enumerate(jobs)]
        raise UsageProblemError(
            f"{len(jobs)} jobs have agents in {run_dir}; say which one with -t",
            help_text="\n  ".join(["pick one:", *lines]))
    found = f"{len(socks)} agent sockets" if socks else "no agent socket"
    where = f"{found} in {run_dir}" if why is None else f"not trusted: {why}"
    note = (
        f"no target given, so probe used {DEFAULT_TARGET} ({where}); "
        "pass -t HOST:PORT or a PID"
    )
    return Endpoint(f"{scheme}://{DEFAULT_TARGET}"), note


def local_jobs(run_dir: str, socks: list[str]) -> list[list[tuple[int, int]]]:
    """The live agents of ``run_dir`` that wrote their ``<pid>.json``, as jobs: lists of
    (rank, pid) by rank. Ranks of one job share the rendezvous torchrun (or the user) gave
    them (MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID); a process without one is a job.
    An agent started by another agent of the run dir belongs to its parent's job: Lightning's
    launcher is rank 0 itself and sets the rendezvous in its own ``os.environ`` after it
    started (its /proc environ has none), then starts the other ranks as its children."""
    import json

    keys: dict[int, tuple[str, ...]] = {}
    ranks: dict[int, int] = {}
    for name in socks:
        pid = runfiles.pid_of(name)
        if pid is None or not os.path.exists(f"/proc/{pid}"):
            continue
        try:
            with open(RunFiles(run_dir, pid).json) as f:
                rank = int(json.load(f).get("rank") or 0)
        except (OSError, ValueError, TypeError, AttributeError):
            continue
        env = _environ(pid)
        key = tuple(env.get(k, "") for k in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"))
        keys[pid], ranks[pid] = key if key[1] else ("pid", str(pid)), rank
    joined = {key: key for key in keys.values()}

    def top(key: tuple[str, ...]) -> tuple[str, ...]:
        while joined[key] != key:
            key = joined[key]
        return key

    for pid in keys:
        parent = _parent(pid)
        if parent in keys and top(keys[pid]) != top(keys[parent]):
            joined[top(keys[pid])] = top(keys[parent])
    jobs: dict[tuple[str, ...], list[tuple[int, int]]] = {}
    for pid, key in keys.items():
        jobs.setdefault(top(key), []).append((ranks[pid], pid))
    return sorted((sorted(j) for j in jobs.values()), key=lambda j: j[0][1])


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            items = f.read().split(b"\0")
    except OSError:
        return {}
    return dict(i.decode(errors="replace").partition("=")[::2] for i in items if b"=" in i)


def parse_rank_list(text: str) -> list[int]:
    """``"0,3,5-7"`` (or with an en dash) -> ``[0, 3, 5, 6, 7]``, sorted, unique."""
    ranks: set[int] = set()
    for part in text.replace("–", "-").split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            if sep:
                a, b = int(lo), int(hi)
                if b < a:
                    raise ValueError
                ranks.update(range(a, b + 1))
            else:
                ranks.add(int(part))
        except ValueError:
            raise UsageProblemError(
                f"bad --rank {text!r}", help_text="use ranks like 0,3 or 0-7 (no negatives)"
            ) from None
    if any(r < 0 for r in ranks):
        raise UsageProblemError(f"bad --rank {text!r}", help_text="ranks are >= 0")
    return sorted(ranks)


def rewrite_endpoint_argv(
    argv: Sequence[str], commands: Iterable[str], value_options: Iterable[str]
) -> list[str]:
    """`probe ENDPOINT COMMAND ...` -> `probe -t ENDPOINT COMMAND ...`.

    Only the first non-option argument is looked at, and only when it is not a command name
    and looks like an endpoint; everything else is left for click to judge.

    Args:
        argv: the arguments after the program name.
        commands: the group's command names (these are never taken as endpoints).
        value_options: group options that consume the next argument (``-t``, ``--rank``...),
            so their values are not mistaken for the first positional argument.
    """
    names = set(commands)
    takes_value = set(value_options)
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return args
        if arg.startswith("-") and arg != "-":
            if arg in takes_value:
                i += 1  # skip its value
            i += 1
            continue
        if arg not in names and looks_like_endpoint(arg):
            return [*args[:i], "-t", arg, *args[i + 1 :]]
        return args
    return args
