"""Fixtures of the MCP SDK tests: a real `grove serve` (with its worker) on a database of
its own, a fixture repository, and an edit workspace of user alice."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import tempfile
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]
GROVE = Path(os.environ.get("GROVE_BIN", ROOT / "target" / "debug" / "grove"))
ALICE = "alice-token-" + secrets.token_hex(8)
BOB = "bob-token-" + secrets.token_hex(8)


@dataclass
class Grove:
    base: str
    database_url: str
    home: Path
    workspace: str
    workspace_path: Path

    def env(self, **extra: str) -> dict[str, str]:
        """A minimal environment for a `grove` child process (no DATABASE_URL)."""
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GROVE_LOG": "warn"}
        env.update(extra)
        return env


def _database(base_url: str) -> tuple[str, str]:
    """Creates a fresh database next to the one of `base_url`; returns (name, url)."""
    name = "grove_mcp_sdk_" + secrets.token_hex(4)
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


def post(base: str, path: str, token: str, body: dict) -> dict:
    req = urllib.request.Request(
        base + path,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.load(resp)


@pytest.fixture(scope="session")
def grove() -> Iterator[Grove]:
    base_url = os.environ.get("GROVE_TEST_DATABASE_URL")
    if not base_url:
        if os.environ.get("GROVE_TEST_REQUIRE_DB") == "1":
            pytest.fail("GROVE_TEST_REQUIRE_DB=1 but GROVE_TEST_DATABASE_URL is unset")
        pytest.skip("GROVE_TEST_DATABASE_URL is unset: no Postgres to run grove against")
    if not GROVE.exists():
        pytest.fail(f"{GROVE} does not exist: build it with `cargo build -p grove-cli`")
    tmp = Path(tempfile.mkdtemp(prefix="grove-mcp-sdk-"))
    name, url = _database(base_url)
    repo_url = _fixture_repo(tmp)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "DATABASE_URL": url,
        "GROVE_HOME": str(tmp / "home"),
        "GROVE_LOCAL_REPO_ROOTS": str(tmp / "repos"),
        "GROVE_API_TOKENS": f"{ALICE}=alice,{BOB}=bob",
        "GROVE_EVICT_SCHEDULE": "off",
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
        session = post(base, "/v1/sessions", ALICE, {
            "project_id": "p1", "repo_name": "o/fixture", "repo_url": repo_url,
            "base_ref": "main", "mode": "edit", "conversation_id": "mcp-sdk",
        })
        ws = session["workspace"]
        yield Grove(base, url, tmp / "home", ws["id"], Path(ws["local_path"]))
    finally:
        server.terminate()
        server.wait(timeout=30)
        subprocess.run(["psql", base_url, "-qc", f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"])
