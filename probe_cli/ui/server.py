"""The dashboard's HTTP server: a stdlib ThreadingHTTPServer inside the CLI process (the CLI
does not depend on fastapi/uvicorn). It serves the page (``static/``), the cached snapshot and
the SQL console; it never talks to agents per request except for the console's own query.

The dashboard is its owner's alone, as the agents are: it runs its console over the owner's
own connections to the agents, so anyone who reached it would borrow the owner's authority.
Every request passes, in order:

1. the peer: the client's socket must belong to our uid or root, by the kernel's word
   (probe_protocol.peers, as the agents ask); another local user, or another host, gets 403;
2. Host must name this server (a DNS-rebinding page cannot read the job's data through the
   operator's browser), and a browser's cross-site request (``Sec-Fetch-Site: cross-site``, or
   an ``Origin`` that is not this server) is refused before it runs anything;
3. a per-run secret: the URL printed carries ``?token=SECRET``; that request gets a
   ``SameSite=Strict`` HttpOnly cookie and a redirect to the page (Jupyter's scheme). Every
   other route needs the cookie: a page on another site cannot send it, nor read it;
4. every data route (``/api/...``) also needs the ``X-Probe-UI-Key`` header, a second per-run
   key that only the page knows (a ``<meta>`` of the page the cookie opens; its JS sends it).
   The cookie alone is not enough: another port of 127.0.0.1 is the *same site*, so a page any
   uid serves there makes the owner's browser send the cookie with a GET or a form. Such a page
   cannot read the dashboard's page (another origin) nor set a custom header on a cross-origin
   request without a CORS preflight, which is never granted.

``probe ui --open`` does not put the secret on the browser's command line (which every uid sees
in ``ps``): it opens ``?once=KEY``, a one-time key that gets the same cookie and is useless once
used.
"""

from __future__ import annotations

import csv
import hmac
import io
import json
import os
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlparse

from probe_protocol.peers import tcp_peer

from .snapshot import Snapshotter, run_sql

#: name -> content type; the only files served (nothing else on disk is reachable).
ASSETS = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
          "app.css": "text/css; charset=utf-8"}
MAX_SQL_BYTES = 64 * 1024
#: The header every data request must carry: the page's own key (module docstring, 4).
KEY_HEADER = "X-Probe-UI-Key"


def _asset(name: str) -> bytes:
    return resources.files("probe_cli.ui").joinpath("static", name).read_bytes()


class DashboardServer(ThreadingHTTPServer):
    daemon_threads = True
    # Ctrl-C must end the dashboard at once: server_close() would otherwise join every handler
    # thread, and one waiting on a browser's idle keep-alive connection never ends (CI: the
    # process outlived its SIGINT by 15 s under load).
    block_on_close = False

    def __init__(self, host: str, port: int, snapshots: Snapshotter) -> None:
        super().__init__((host, port), _Handler)
        self.snapshots = snapshots
        self.assets = {name: _asset(name) for name in ASSETS}
        shown = f"[{host}]" if ":" in host else host
        self.secret = secrets.token_urlsafe(24)
        self.page_key = secrets.token_urlsafe(24)  # the X-Probe-UI-Key the page's JS sends
        self.once: set[str] = set()  # one-time keys (``--open``), each removed when used
        self._once_lock = threading.Lock()
        self.cookie = f"probe_ui_{self.server_address[1]}"  # one per port: cookies ignore ports
        self.url = f"http://{shown}:{self.server_address[1]}/?token={self.secret}"
        port_s = str(self.server_address[1])
        self.hosts = {f"{h}:{port_s}" for h in (shown, "localhost", "127.0.0.1", "[::1]")}

    def one_time_url(self) -> str:
        """A URL that opens the dashboard once (``--open``): safe on a command line."""
        key = secrets.token_urlsafe(24)
        with self._once_lock:
            self.once.add(key)
        return self.url.split("?", 1)[0] + f"?once={key}"

    def use_once(self, key: str) -> bool:
        with self._once_lock:
            for k in self.once:
                if hmac.compare_digest(k.encode(), key.encode()):
                    self.once.discard(k)
                    return True
        return False

    def serve_in_thread(self) -> threading.Thread:
        t = threading.Thread(target=self.serve_forever, name="probe-ui.http", daemon=True)
        t.start()
        return t


class _Handler(BaseHTTPRequestHandler):
    server: DashboardServer
    protocol_version = "HTTP/1.1"
    timeout = 60  # an idle keep-alive connection frees its thread (the page polls every 1.5 s)

    def log_message(self, *args: Any) -> None:  # the terminal shows the URL, not access logs
        pass

    def setup(self) -> None:
        super().setup()
        # Once per connection: who holds the client's socket (a keep-alive connection keeps it).
        peer = tcp_peer(self.connection)
        if peer.kind == "local" and peer.uid in (os.getuid(), 0):
            self.refusal: str | None = None
        elif peer.kind == "local":
            self.refusal = (f"uid {peer.uid} is not this dashboard's owner (uid {os.getuid()}): "
                            "run your own `probe ui`")
        else:
            self.refusal = ("the dashboard serves its owner on this machine only: tunnel with "
                            "ssh -L instead of opening it to the network")

    def _refuse(self, why: str) -> None:
        # The body of a refused POST is never read: close, or it would parse as the next request.
        self.close_connection = True
        self._send(403, json.dumps({"error": why}).encode(), "application/json",
                   {"Connection": "close"})

    def _gate(self, *, secret_needed: bool = True, data: bool = False) -> bool:
        """True when this request may go on; otherwise the refusal has been sent.

        Args:
            data: an ``/api/`` route: the page's key header is needed too."""
        if self.refusal is not None:
            self._refuse(self.refusal)
            return False
        if self.headers.get("Host") not in self.server.hosts:
            self._refuse("unexpected Host header: open the URL probe ui printed")
            return False
        origin = self.headers.get("Origin")
        cross_origin = origin is not None and origin.rstrip("/") + "/" not in {
            f"http://{h}/" for h in self.server.hosts}
        if self.headers.get("Sec-Fetch-Site") == "cross-site" or cross_origin:
            self._refuse("cross-site request refused")
            return False
        if secret_needed and not hmac.compare_digest(
                self._cookie().encode(), self.server.secret.encode()):
            self._refuse("open the URL `probe ui` printed (it carries this run's secret); this "
                         "browser has no cookie for it")
            return False
        if data and not hmac.compare_digest(
                (self.headers.get(KEY_HEADER) or "").encode(), self.server.page_key.encode()):
            # The cookie came, but not from the dashboard's own page (another port of
            # 127.0.0.1 is the same site, and the browser sends the cookie there too).
            self._refuse(f"data routes need the {KEY_HEADER} header the dashboard's page sends: "
                         "use the page `probe ui` printed")
            return False
        return True

    def _cookie(self) -> str:
        for part in (self.headers.get("Cookie") or "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == self.server.cookie:
                return value
        return ""

    def _send(self, status: int, body: bytes, ctype: str, extra: dict[str, str] | None = None
              ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy",
                         "default-src 'self'; style-src 'self'; img-src 'self' data:; "
                         "frame-ancestors 'none'")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj, default=str).encode(), "application/json")

    def do_GET(self) -> None:
        url = urlparse(self.path)
        query = parse_qs(url.query)
        offered = (query.get("token") or [""])[0]
        once = (query.get("once") or [""])[0]
        if offered or once:
            self._exchange(offered, once)
            return
        if not self._gate(data=url.path.startswith("/api/")):
            return
        name = "index.html" if url.path in ("/", "/index.html") else url.path.removeprefix(
            "/static/")
        if name == "index.html":
            page = self.server.assets[name].replace(b"PROBE_UI_KEY",
                                                    self.server.page_key.encode())
            self._send(200, page, ASSETS[name])
        elif name in ASSETS:
            self._send(200, self.server.assets[name], ASSETS[name])
        elif url.path == "/api/snapshot":
            self._json(200, self.server.snapshots.current())
        elif url.path == "/api/query.csv":
            sql = (parse_qs(url.query).get("sql") or [""])[0]
            self._csv(sql)
        else:
            self._json(404, {"error": f"no such page: {url.path}"})

    def _exchange(self, offered: str, once: str) -> None:
        """``?token=SECRET`` (or a one-time ``?once=KEY``): the cookie, and a redirect to the
        page without the secret in it."""
        if not self._gate(secret_needed=False):
            return
        if once and not self.server.use_once(once):
            self._refuse("this one-time link was used already: open the URL `probe ui` printed")
            return
        if not once and not hmac.compare_digest(offered.encode(), self.server.secret.encode()):
            self._refuse("wrong token: open the URL this run of `probe ui` printed")
            return
        self._send(303, b"", "text/plain", {
            "Location": "/",
            "Set-Cookie": f"{self.server.cookie}={self.server.secret}; HttpOnly; "
                          "SameSite=Strict; Path=/"})

    def do_POST(self) -> None:
        if not self._gate(data=True):
            return
        if urlparse(self.path).path != "/api/query":
            self._json(404, {"error": "no such route"})
            return
        n = int(self.headers.get("Content-Length") or 0)
        if n > MAX_SQL_BYTES:
            self._json(413, {"error": f"SQL over {MAX_SQL_BYTES} bytes"})
            return
        try:
            sql = json.loads(self.rfile.read(n) or b"{}").get("sql", "")
        except (ValueError, AttributeError):
            self._json(400, {"error": 'send {"sql": "SELECT ..."}'})
            return
        self._json(200, self._query(sql))

    def _query(self, sql: str) -> dict[str, Any]:
        if not sql.strip():
            return {"columns": [], "rows": [], "errors": ["type a SELECT first"]}
        snaps = self.server.snapshots
        return run_sql(snaps.session, snaps.lock, sql)

    def _csv(self, sql: str) -> None:
        res = self._query(sql)
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(res["columns"])
        w.writerows(res["rows"])
        self._send(200, buf.getvalue().encode(), "text/csv; charset=utf-8",
                   {"Content-Disposition": 'attachment; filename="probe-query.csv"'})
