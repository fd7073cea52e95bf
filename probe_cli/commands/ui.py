"""`probe ui`: the live dashboard, served from this process to a browser."""

from __future__ import annotations

import ipaddress
import os
import signal
import sys
import time
from typing import Any

import click

from ..errors import UsageProblemError
from ..outcome import Outcome
from ..transport.session import Session
from . import pass_session


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@click.command("ui")
@click.option("--port", type=click.IntRange(0, 65535), default=8700, show_default=True,
              help="Port of the dashboard (0: any free port).")
@click.option("--bind", "bind", default="127.0.0.1", show_default=True,
              help="Address the dashboard listens on. It answers only your uid (or root) on "
                   "this machine, with the secret in the URL it prints: from elsewhere, tunnel "
                   "with ssh -L.")
@click.option("--refresh", type=click.FloatRange(0.5, 60), default=1.5, show_default=True,
              help="Seconds between refreshes (one fan-out to every rank each; none while no "
                   "page is open).")
@click.option("--open/--no-open", "open_browser", default=False,
              help="Open the page in this machine's browser (with a one-time link: the secret "
                   "URL never goes on the browser's command line).")
@pass_session
def command(session: Session, port: int, bind: str, refresh: float,
            open_browser: bool) -> Outcome:
    """Serve a live dashboard of every rank: tiles with step and state, step time and memory
    over steps, the slowest modules, the hang/straggler/doctor verdicts, grouped backtraces
    and a read-only SQL console. Reaches the ranks as every other command (-t, token, TLS);
    the agents get no new port. Ctrl-C stops it."""
    from ..ui.server import DashboardServer
    from ..ui.snapshot import Snapshotter

    if not _loopback(bind):
        click.echo(f"probe: warning: the dashboard listens on {bind}, not loopback, but "
                   "answers only your uid on this machine: tunnel with ssh -L to reach it from "
                   "elsewhere", err=True)
    snaps = Snapshotter(session, refresh_s=refresh).start()
    try:
        server = DashboardServer(bind, port, snaps)
    except OSError as e:
        snaps.stop()
        raise UsageProblemError(f"cannot listen on {bind}:{port}: {e.strerror}",
                                help_text="pick another --port (0 picks a free one)") from None
    server.serve_in_thread()
    click.echo(f"probe ui: dashboard at {server.url}  (Ctrl-C stops it)", err=False)
    sys.stdout.flush()
    if open_browser:
        import webbrowser

        # Not the printed URL: a browser's command line is in `ps` for every uid. A one-time
        # key gets the same cookie once, and is useless afterwards (ui/server.py).
        webbrowser.open(server.one_time_url())
    def stop(*_: Any) -> None:
        raise KeyboardInterrupt  # SIGTERM (a script's `kill`) ends it like Ctrl-C

    signal.signal(signal.SIGTERM, stop)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()
        snaps.stop()
    # A fan-out in flight (the doctor round: several calls per rank, up to --timeout each)
    # would hold interpreter exit in concurrent.futures' atexit join; there is nothing left to
    # save, and Ctrl-C must end the dashboard now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
