"""A loopback proxy in front of a real grove that answers the next requests itself
(a 503 or 429 with `Retry-After`, as a load balancer or rate limiter would) and
forwards the rest, recording every request it saw."""

from __future__ import annotations

import http.client
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


@dataclass
class Canned:
    status: int
    body: bytes = b""
    retry_after: str | None = None
    content_type: str = "text/plain"


@dataclass
class Seen:
    method: str
    path: str
    at: float
    headers: dict[str, str]
    body: bytes


class FlakyProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = urlsplit(upstream)
        self.canned: list[Canned] = []
        #: Cut the next followed event stream after this many messages.
        self.cut_follow_after: int | None = None
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with proxy._lock:
                    proxy.seen.append(
                        Seen(self.command, self.path, time.monotonic(), dict(self.headers), body)
                    )
                    canned = proxy.canned.pop(0) if proxy.canned else None
                if canned is not None:
                    self.send_response(canned.status)
                    self.send_header("Content-Type", canned.content_type)
                    self.send_header("Content-Length", str(len(canned.body)))
                    if canned.retry_after is not None:
                        self.send_header("Retry-After", canned.retry_after)
                    self.end_headers()
                    self.wfile.write(canned.body)
                    return
                conn = http.client.HTTPConnection(
                    proxy.upstream.hostname or "127.0.0.1", proxy.upstream.port, timeout=120
                )
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                conn.request(self.command, self.path, body=body or None, headers=headers)
                resp = conn.getresponse()
                if "follow=true" in self.path:
                    with proxy._lock:
                        cut, proxy.cut_follow_after = proxy.cut_follow_after, None
                    self._stream(resp, cut)
                    conn.close()
                    return
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "content-length", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                conn.close()

            def _stream(self, resp: http.client.HTTPResponse, cut: int | None) -> None:
                """Relays an event stream line by line (close-delimited), closing it
                after `cut` messages, as a dropped connection would."""
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "content-length", "connection"):
                        self.send_header(k, v)
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True
                sent, data = 0, False
                try:
                    while cut is None or sent < cut:
                        line = resp.readline()
                        if not line:
                            return
                        self.wfile.write(line)
                        self.wfile.flush()
                        if line.startswith(b"data:"):
                            data = True
                        elif line.strip() == b"" and data:
                            sent, data = sent + 1, False
                except OSError:
                    return  # the client went away

            do_GET = do_POST = do_DELETE = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
