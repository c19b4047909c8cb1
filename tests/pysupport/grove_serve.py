"""A real `grove serve` (with its worker) for the Python suites (tests/mcp_sdk,
tests/console_browser): on a database of its own next to GROVE_TEST_DATABASE_URL's, with
a fixture repository under its local repo roots, stopped and its database dropped at the
end. Each suite's conftest puts this directory on `sys.path` and keeps its own tokens,
settings and fixtures."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import tempfile
import urllib.parse
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]
GROVE = Path(os.environ.get("GROVE_BIN", ROOT / "target" / "debug" / "grove"))


@dataclass
class Served:
    """A running `grove serve`."""

    base: str
    database_url: str
    home: Path
    repo_url: str


def post(base: str, path: str, token: str, body: dict) -> dict:
    req = urllib.request.Request(
        base + path,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.load(resp)


def _database(base_url: str, prefix: str) -> tuple[str, str]:
    """Creates a fresh database next to the one of `base_url`; returns (name, url)."""
    name = prefix + secrets.token_hex(4)
    subprocess.run(["psql", base_url, "-qc", f"CREATE DATABASE {name}"], check=True)
    parts = urllib.parse.urlsplit(base_url)
    return name, urllib.parse.urlunsplit(parts._replace(path="/" + name))


def _fixture_repo(root: Path) -> str:
    repo = root / "repos" / "fixture"
    repo.mkdir(parents=True)
    (repo / "README.md").write_text("hello\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-qm", "init"], check=True)
    return f"file://{repo}"


@contextmanager
def serve(name: str, tokens: str, evict_schedule: str) -> Iterator[Served]:
    """Starts `grove serve` with `GROVE_API_TOKENS=tokens` and `GROVE_EVICT_SCHEDULE`;
    `name` names its database (`grove_<name>_...`) and temporary directory. Skips the
    test without GROVE_TEST_DATABASE_URL (fails under GROVE_TEST_REQUIRE_DB=1)."""
    base_url = os.environ.get("GROVE_TEST_DATABASE_URL")
    if not base_url:
        if os.environ.get("GROVE_TEST_REQUIRE_DB") == "1":
            pytest.fail("GROVE_TEST_REQUIRE_DB=1 but GROVE_TEST_DATABASE_URL is unset")
        pytest.skip("GROVE_TEST_DATABASE_URL is unset: no Postgres to run grove against")
    if not GROVE.exists():
        pytest.fail(f"{GROVE} does not exist: build it with `cargo build -p grove-cli`")
    tmp = Path(tempfile.mkdtemp(prefix=f"grove-{name.replace('_', '-')}-"))
    db_name, url = _database(base_url, f"grove_{name}_")
    repo_url = _fixture_repo(tmp)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "DATABASE_URL": url,
        "GROVE_HOME": str(tmp / "home"),
        "GROVE_LOCAL_REPO_ROOTS": str(tmp / "repos"),
        "GROVE_API_TOKENS": tokens,
        "GROVE_EVICT_SCHEDULE": evict_schedule,
        "GROVE_LOG": "warn",
    }
    server = subprocess.Popen(
        [str(GROVE), "serve", "--bind", "127.0.0.1:0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=open(tmp / "serve.log", "w"),
        text=True,
    )
    try:
        assert server.stdout is not None
        first = server.stdout.readline().strip()
        assert first.startswith("grove: listening on "), first
        base = first.removeprefix("grove: listening on ")
        yield Served(base, url, tmp / "home", repo_url)
    finally:
        server.terminate()
        server.wait(timeout=30)
        subprocess.run(
            ["psql", base_url, "-qc", f"DROP DATABASE IF EXISTS {db_name} WITH (FORCE)"]
        )
