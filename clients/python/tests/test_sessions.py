"""Repo caches, sessions and workspaces against a real server."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest

from grove_client import Client, NotFoundError

from .conftest import OPS, Grove, acquire


def test_ensuring_a_repo_cache_twice_with_one_key_is_one_command(
    alice: Client, repo_url: str
) -> None:
    key = f"ensure-{uuid.uuid4()}"
    first = alice.ensure_repo_cache(repo_name="o/fixture", repo_url=repo_url, idempotency_key=key)
    again = alice.ensure_repo_cache(repo_name="o/fixture", repo_url=repo_url, idempotency_key=key)
    assert first.command_id == again.command_id
    assert first.repo_cache.repo_name == "o/fixture"
    assert first.repo_cache.state == "ready"
    assert first.repo_cache.created_at.tzinfo is not None


def test_acquiring_twice_returns_the_same_workspace(alice: Client, repo_url: str) -> None:
    s1 = acquire(alice, repo_url, conversation="same-conversation")
    s2 = acquire(alice, repo_url, conversation="same-conversation")
    assert s1.session_id == s2.session_id == s1.workspace.id
    ws = alice.get_workspace(s1.session_id)
    assert ws.user_id == "alice" and ws.mode == "edit"
    assert ws.conversation_id == "same-conversation"
    assert ws.capabilities.writable and ws.branch_name


def test_workspaces_are_listed_page_by_page(alice: Client, repo_url: str) -> None:
    ids = {acquire(alice, repo_url).session_id for _ in range(3)}
    page = alice.list_workspaces(limit=1)
    assert len(page.workspaces) == 1 and page.next_cursor
    seen = [w.id for w in alice.iter_workspaces(page_size=2)]
    assert ids <= set(seen)
    assert len(seen) == len(set(seen)), "a workspace was listed twice"


def test_an_operator_lists_another_users_workspaces(
    grove: Grove, alice: Client, repo_url: str
) -> None:
    s = acquire(alice, repo_url)
    with grove.client(OPS) as ops:
        assert s.session_id in {w.id for w in ops.iter_workspaces(user="alice")}
        assert ops.get_workspace(s.session_id).user_id == "alice"


def test_pinning_and_unpinning(alice: Client, repo_url: str) -> None:
    s = acquire(alice, repo_url)
    until = datetime.now(timezone.utc) + timedelta(hours=2)
    pinned = alice.pin_workspace(s.session_id, until=until)
    assert pinned.pinned_until is not None
    assert abs((pinned.pinned_until - until).total_seconds()) < 1
    assert alice.pin_workspace(s.session_id, until=None).pinned_until is None
    with pytest.raises(ValueError):
        alice.pin_workspace(s.session_id, until=datetime.now())


def test_releasing_keeps_the_files_and_destroying_removes_the_workspace(
    alice: Client, repo_url: str
) -> None:
    s = acquire(alice, repo_url)
    alice.tools.write_file(s.session_id, "kept.txt", "kept\n")
    alice.release_session(s.session_id, destroy_runtime=True)
    assert alice.get_workspace(s.session_id).state == "released"
    again = acquire(alice, repo_url, conversation=s.workspace.conversation_id)
    assert again.session_id == s.session_id
    assert alice.tools.read_file(s.session_id, "kept.txt").content == "kept\n"
    # Restoring a workspace that is not evicted answers it as it is.
    assert alice.restore_workspace(s.session_id).id == s.session_id
    alice.destroy_workspace(s.session_id)
    with pytest.raises(NotFoundError):
        alice.get_workspace(s.session_id)


def test_an_analysis_workspace_is_read_only(alice: Client, repo_url: str) -> None:
    s = alice.acquire_session(
        project_id="p1",
        repo_name="o/fixture",
        repo_url=repo_url,
        base_ref="main",
        mode="analysis",
    )
    assert not s.workspace.capabilities.writable
    tools = alice.list_tools(s.session_id)
    assert not tools.writable
    assert "write_file" not in {t.name for t in tools.tools}
