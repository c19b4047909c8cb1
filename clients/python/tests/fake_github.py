"""A fake GitHub on loopback for the pull-request tests: the three REST endpoints grove
calls and git's smart HTTP (through the real `git http-backend`) for the repositories
it serves, so one host is both the API and the remote, as tests/support/fake_github.rs
does for the Rust suite (whose reference notes apply; this one models less).

- `POST /api/v3/repos/{owner}/{repo}/pulls` (201), `GET .../pulls/{n}` (200, 404),
  `POST .../issues/{n}/comments` (201); writes need `Authorization: Bearer <token>`
  (401 "Bad credentials" otherwise).
- `rate_limit_next` answers the next REST request with a primary rate limit (403,
  `x-ratelimit-remaining: 0`), as GitHub does.
- git: clones anonymous; a push needs HTTP basic auth whose password is the token.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

PULLS = re.compile(r"^/api/v3/repos/([^/]+)/([^/]+)/pulls$")
PULL = re.compile(r"^/api/v3/repos/([^/]+)/([^/]+)/pulls/(\d+)$")
COMMENTS = re.compile(r"^/api/v3/repos/([^/]+)/([^/]+)/issues/(\d+)/comments$")
GIT = re.compile(r"^/([^/]+)/([^/]+?)(?:\.git)?/(info/refs|git-upload-pack|git-receive-pack)$")


class FakeGitHub:
    def __init__(self, token: str) -> None:
        self.token = token
        self.repos: dict[str, Path] = {}
        self.pulls: dict[tuple[str, int], dict[str, Any]] = {}
        self.comments: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str, str | None]] = []
        self.rate_limited = 0
        self._next = 1
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if size == 0:
                            self.rfile.readline()
                            return out
                        out += self.rfile.read(size)
                        self.rfile.readline()
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _handle(self) -> None:
                path, _, query = self.path.partition("?")
                body = self._body()
                g = GIT.match(path)
                if g is not None:
                    fake._git(self, f"{g[1]}/{g[2]}", g[3], query, body)
                    return
                auth = self.headers.get("Authorization")
                with fake._lock:
                    fake.requests.append((self.command, path, auth))
                    limited = fake.rate_limited > 0
                    if limited:
                        fake.rate_limited -= 1
                if limited:
                    reset = str(int(time.time()) + 60)
                    self._send(
                        403,
                        {"message": "API rate limit exceeded"},
                        {"x-ratelimit-remaining": "0", "x-ratelimit-reset": reset},
                    )
                    return
                authorized = auth in (f"Bearer {fake.token}", f"token {fake.token}")
                if self.command == "POST" and not authorized:
                    self._send(401, {"message": "Bad credentials"})
                    return
                status, answer = fake._rest(self.command, path, body)
                self._send(status, answer)

            do_GET = do_POST = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.origin = f"http://127.0.0.1:{self._server.server_address[1]}"
        self.api_url = f"{self.origin}/api/v3"

    def add_repo(self, full_name: str, bare: Path) -> str:
        self.repos[full_name] = bare
        return f"{self.origin}/{full_name}.git"

    def rate_limit_next(self, n: int = 1) -> None:
        with self._lock:
            self.rate_limited += n

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _rest(self, method: str, path: str, raw: bytes) -> tuple[int, Any]:
        if method == "POST" and (m := PULLS.match(path)):
            repo = f"{m[1]}/{m[2]}"
            req = json.loads(raw or b"{}")
            bare = self.repos.get(repo)
            if bare is None:
                return 404, {"message": "Not Found"}
            try:
                sha = subprocess.run(
                    ["git", "rev-parse", f"refs/heads/{req['head']}"],
                    cwd=bare,
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.strip()
            except subprocess.CalledProcessError:
                return 422, {
                    "message": "Validation Failed",
                    "errors": [{"field": "head", "code": "invalid"}],
                }
            with self._lock:
                number = self._next
                self._next += 1
            pull = {
                "number": number,
                "state": "open",
                "title": req["title"],
                "body": req.get("body"),
                "html_url": f"{self.origin}/{repo}/pull/{number}",
                "head": {"ref": req["head"], "sha": sha},
                "base": {"ref": req["base"]},
                "draft": bool(req.get("draft")),
                "merged": False,
            }
            self.pulls[(repo, number)] = pull
            return 201, pull
        if method == "GET" and (m := PULL.match(path)):
            found = self.pulls.get((f"{m[1]}/{m[2]}", int(m[3])))
            return (200, found) if found else (404, {"message": "Not Found"})
        if method == "POST" and (m := COMMENTS.match(path)):
            if (f"{m[1]}/{m[2]}", int(m[3])) not in self.pulls:
                return 404, {"message": "Not Found"}
            comment = {
                "id": 9000 + len(self.comments),
                "html_url": f"{self.origin}/{m[1]}/{m[2]}/pull/{m[3]}#comment",
                "body": json.loads(raw or b"{}").get("body"),
            }
            self.comments.append(comment)
            return 201, comment
        return 404, {"message": "Not Found"}

    def _git(
        self, handler: BaseHTTPRequestHandler, repo: str, service: str, query: str, body: bytes
    ) -> None:
        bare = self.repos.get(repo)
        if bare is None:
            handler.send_response(404)
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        pushing = service == "git-receive-pack" or "service=git-receive-pack" in query
        user = None
        if pushing:
            auth = handler.headers.get("Authorization", "")
            if auth.startswith("Basic "):
                _, _, password = base64.b64decode(auth[6:]).decode().partition(":")
                if password == self.token:
                    user = "pusher"
            if user is None:
                handler.send_response(401)
                handler.send_header("WWW-Authenticate", 'Basic realm="fake"')
                handler.send_header("Content-Length", "0")
                handler.end_headers()
                return
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_PROJECT_ROOT": str(bare.parent),
            "GIT_HTTP_EXPORT_ALL": "1",
            "PATH_INFO": f"/{bare.name}/{service}",
            "QUERY_STRING": query,
            "REQUEST_METHOD": handler.command,
            "CONTENT_TYPE": handler.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "GIT_CONFIG_NOSYSTEM": "1",
            "HOME": str(bare.parent),
        }
        if user:
            env["REMOTE_USER"] = user
        out = subprocess.run(
            ["git", "http-backend"], input=body, env=env, capture_output=True
        ).stdout
        head, _, payload = out.partition(b"\r\n\r\n")
        status = 200
        headers: list[tuple[str, str]] = []
        for line in head.decode().split("\r\n"):
            k, _, v = line.partition(":")
            if k.lower() == "status":
                status = int(v.strip().split()[0])
            elif k:
                headers.append((k, v.strip()))
        handler.send_response(status)
        for k, v in headers:
            handler.send_header(k, v)
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)
