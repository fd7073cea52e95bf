"""`probe launch [options] -- CMD ...`: run a training command with an agent in every rank.

The command only prepares the environment (``PROBE=1`` and the ``PROBE_*`` settings) and then
*replaces itself* with CMD (``os.execvpe``), so torchrun, srun or deepspeed receive signals and
report exit codes exactly as if started directly. Which processes get an agent is decided inside
them by the ``.pth`` hook: launchers (torchrun, deepspeed's runner, this CLI) never do, ranks do,
and rank r on a node listens on BASE + LOCAL_RANK (SLURM_LOCALID under srun).

Multi-node deepspeed forwards only some variables to remote nodes: list PROBE, PROBE_PORT (and
the others you set) in ``.deepspeed_env`` there.
"""

from __future__ import annotations

import ipaddress
import os
import re
import secrets
import shutil
from collections.abc import Mapping

import click

from ..transport.targets import default_run_dir
from ._certs import default_hosts, make_job_cert

_TRACE = re.compile(r"^(on|off|every:[1-9][0-9]*)$")


def launch_env(
    environ: Mapping[str, str],
    *,
    port: int | None = None,
    host: str | None = None,
    token_file: str | None = None,
    trace: str | None = None,
) -> dict[str, str]:
    """The environment CMD runs with: ``environ`` plus PROBE=1 and the given settings.

    The token itself never goes into the environment (``ps e`` and /proc/PID/environ show it
    to the same uid): only the path of the file holding it.
    """
    env = dict(environ)
    env["PROBE"] = "1"
    if port is not None:
        env["PROBE_PORT"] = str(port)
    if host is not None:
        env["PROBE_HOST"] = host
    if token_file is not None:
        env["PROBE_TOKEN_FILE"] = os.path.abspath(token_file)
        env.pop("PROBE_TOKEN", None)
    if trace is not None:
        env["PROBE_TRACE"] = trace
    return env


def _is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def ensure_token_file(path: str) -> bool:
    """A 0600 file holding a token at ``path``: made (True) when missing, else checked.

    Made without ever replacing one: written to a private temporary file, then hard-linked in
    place, which fails if another node's launch made it first (then that token is the job's).
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, mode=0o700, exist_ok=True)
        tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
    except OSError as e:
        raise click.UsageError(f"cannot use --token-file {path}: {e.strerror}") from None
    if mode & 0o077:
        raise click.UsageError(f"token file {path} is readable by other users "
                               f"(mode {mode & 0o777:o}); run: chmod 600 {path}")
    return False


def _trace_mode(_: click.Context, __: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip().lower().replace(" ", ":")
    if not _TRACE.match(value):
        raise click.BadParameter("expected on, off or every:N (N ≥ 1)")
    return value


@click.command(
    "launch",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.option("--port", type=click.IntRange(0, 65535), default=None,
              help="Base port: rank r on a node listens on PORT + LOCAL_RANK. 0 picks free "
                   "ports (find them with /v1/ranks). [default: 9700, or PROBE_PORT]")
@click.option("--host", default=None,
              help="Address the agents bind. [default: 127.0.0.1; anything else serves TCP only "
                   "with a token: one is made for the job if --token-file is not given]")
@click.option("--token-file", type=click.Path(dir_okay=False), default=None,
              help="File holding the job's token (mode 0600). Made, with a fresh token, when it "
                   "does not exist; give every node the same (shared) file. Its path, not the "
                   "token, is passed to the ranks (PROBE_TOKEN_FILE).")
@click.option("--trace", callback=_trace_mode, default=None,
              help="Module tracing at start: on, off or every:N. [default: every:10]")
@click.option("--make-cert", "cert_dir", type=click.Path(file_okay=False), default=None,
              metavar="DIR",
              help="Serve TLS with a certificate made for this job (a CA of its own, never "
                   "kept, and one certificate) in DIR, or the one already there: the mode for "
                   "reaching ranks across nodes. Prints the --cacert to use.")
@click.option("--cert-host", "cert_hosts", multiple=True, metavar="NAME",
              help="With --make-cert: a name or address of a node the certificate covers "
                   "(repeat for every node). [default: this node's name and addresses]")
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED, required=True)
def command(port: int | None, host: str | None, token_file: str | None, trace: str | None,
            cert_dir: str | None, cert_hosts: tuple[str, ...], cmd: tuple[str, ...]) -> None:
    """Run CMD (torchrun, python, srun, deepspeed …) with a probe agent in every rank.

    \b
    Example:
      probe launch --port 9700 -- torchrun --nproc-per-node 8 train.py
      probe -t localhost:9700 hang
    """
    args = list(cmd)
    if args and args[0] == "--":
        args = args[1:]
    if not args:
        raise click.UsageError("give the command to run after --, e.g. probe launch -- torchrun …")
    exe = shutil.which(args[0])
    if exe is None:
        raise click.UsageError(f"{args[0]}: command not found")
    wanted_host = host or os.environ.get("PROBE_HOST", "127.0.0.1")
    if token_file is None and not _is_loopback(wanted_host) and not (
            os.environ.get("PROBE_TOKEN") or os.environ.get("PROBE_TOKEN_FILE")):
        # off loopback the agents serve TCP only with a token, so make the job one.
        token_file = os.path.join(default_run_dir(), f"job-{os.getpid()}.token")
    if token_file is not None:
        made = ensure_token_file(token_file)
        click.echo(f"probe: {'made the job token' if made else 'job token'} in {token_file} "
                   f"(0600); from another host: probe --token-file {token_file} -t HOST:PORT …",
                   err=True)
    env = launch_env(os.environ, port=port, host=host, token_file=token_file, trace=trace)
    if cert_dir is not None:
        ca, cert, key, made = make_job_cert(cert_dir, list(cert_hosts) or default_hosts())
        env["PROBE_TLS_CERT"], env["PROBE_TLS_KEY"] = os.path.abspath(cert), os.path.abspath(key)
        click.echo(f"probe: {'made the' if made else 'using the'} job's TLS certificate in "
                   f"{cert_dir}; reach the ranks with: probe --cacert {os.path.abspath(ca)} "
                   "-t HOST:PORT …", err=True)
    shown_host = env.get("PROBE_HOST", "127.0.0.1")
    shown_port = env.get("PROBE_PORT", "9700")
    click.echo(
        f"probe: agents on {shown_host}:{shown_port}+LOCAL_RANK; "
        f"ask all ranks with: probe -t {shown_host}:{shown_port} hang",
        err=True,
    )
    os.execve(exe, args, env)
