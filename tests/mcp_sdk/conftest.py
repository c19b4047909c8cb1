"""Fixtures of the MCP SDK tests: a real `grove serve` (with its worker) on a database of
its own, a fixture repository, and an edit workspace of user alice."""

from __future__ import annotations

import os
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pysupport"))

from grove_serve import GROVE, post, serve  # noqa: E402

__all__ = ["ALICE", "BOB", "GROVE", "Grove"]

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


@pytest.fixture(scope="session")
def grove() -> Iterator[Grove]:
    with serve("mcp_sdk", f"{ALICE}=alice,{BOB}=bob", "off") as s:
        session = post(s.base, "/v1/sessions", ALICE, {
            "project_id": "p1", "repo_name": "o/fixture", "repo_url": s.repo_url,
            "base_ref": "main", "mode": "edit", "conversation_id": "mcp-sdk",
        })
        ws = session["workspace"]
        yield Grove(s.base, s.database_url, s.home, ws["id"], Path(ws["local_path"]))
