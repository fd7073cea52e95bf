"""The dashboard's HTTP server: a stdlib ThreadingHTTPServer inside the CLI process (the CLI
does not depend on fastapi/uvicorn). It serves the page (``static/``), the cached snapshot and
the SQL console; it never talks to agents per request except for the console's own query.

Loopback by default. Requests must name this server in Host (a DNS-rebinding page cannot read
the job's data through the operator's browser), and the console's POST must come from the page
itself (Origin, when the browser sends one, is this server).
"""

from __future__ import annotations

import csv
import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlparse

from .snapshot import Snapshotter, run_sql

#: name -> content type; the only files served (nothing else on disk is reachable).
ASSETS = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
          "app.css": "text/css; charset=utf-8"}
MAX_SQL_BYTES = 64 * 1024


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
        self.url = f"http://{shown}:{self.server_address[1]}/"
        port_s = str(self.server_address[1])
        self.hosts = {f"{h}:{port_s}" for h in (shown, "localhost", "127.0.0.1", "[::1]")}

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

    def _send(self, status: int, body: bytes, ctype: str, extra: dict[str, str] | None = None
              ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy",
                         "default-src 'self'; style-src 'self'; img-src 'self' data:")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj, default=str).encode(), "application/json")

    def _host_ok(self) -> bool:
        if self.headers.get("Host") in self.server.hosts:
            return True
        self._json(403, {"error": "unexpected Host header: open the URL probe ui printed"})
        return False

    def do_GET(self) -> None:
        if not self._host_ok():
            return
        url = urlparse(self.path)
        name = "index.html" if url.path in ("/", "/index.html") else url.path.removeprefix(
            "/static/")
        if name in ASSETS:
            self._send(200, self.server.assets[name], ASSETS[name])
        elif url.path == "/api/snapshot":
            self._json(200, self.server.snapshots.current())
        elif url.path == "/api/query.csv":
            sql = (parse_qs(url.query).get("sql") or [""])[0]
            self._csv(sql)
        else:
            self._json(404, {"error": f"no such page: {url.path}"})

    def do_POST(self) -> None:
        if not self._host_ok():
            return
        origin = self.headers.get("Origin")
        if origin is not None and origin.rstrip("/") + "/" not in {
                f"http://{h}/" for h in self.server.hosts}:
            self._json(403, {"error": "cross-origin request refused"})
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
