"""Every agent tool as a typed method, against a real workspace."""

from __future__ import annotations

import hashlib

import pytest

from grove_client import Client, ConflictError, InvalidInputError, RejectedError, Session, models

from .conftest import Grove, git


def test_the_tool_list_names_every_typed_method(alice: Client, session: Session) -> None:
    tools = alice.list_tools(session.session_id)
    assert tools.workspace_id == session.session_id and tools.writable
    names = {t.name for t in tools.tools}
    assert {"view", "create", "str_replace", "git_commit"} <= names
    for t in tools.tools:
        assert hasattr(alice.tools, t.name), f"no typed method for tool {t.name}"
        assert t.input_schema.get("type") == "object"


def test_file_tools(alice: Client, session: Session) -> None:
    ws = session.session_id
    viewed = alice.tools.view(ws, "notes.txt", range=(2, 3))
    assert "two" in viewed.text and "one" not in viewed.text
    made = alice.tools.create(ws, "new/file.txt", "a\nb\n")
    assert made.created and made.path == "new/file.txt" and made.size_bytes == 4
    assert made.sha256 == hashlib.sha256(b"a\nb\n").hexdigest()
    replaced = alice.tools.str_replace(ws, "new/file.txt", "b\n", "B\n")
    assert not replaced.created
    alice.tools.insert(ws, "new/file.txt", 0, "top\n")
    read = alice.tools.read_file(ws, "new/file.txt")
    assert read.content == "top\na\nB\n" and read.size_bytes == 8
    alice.tools.write_file(ws, "new/file.txt", "whole\n")
    assert alice.tools.read_file(ws, "new/file.txt").content == "whole\n"
    listing = alice.tools.list_dir(ws, "new")
    assert [(e.path, e.kind) for e in listing.entries] == [("new/file.txt", "file")]
    root = {e.path for e in alice.tools.list_dir(ws).entries}
    assert {"README.md", "src", "notes.txt"} <= root


def test_search(alice: Client, session: Session) -> None:
    found = alice.tools.search(session.session_id, "hello")
    assert [(h.path, h.line) for h in found.hits] == [("README.md", 2)]
    regex = alice.tools.search(session.session_id, r"t(wo|hree)", regex=True, glob=["*.txt"])
    assert [h.text for h in regex.hits] == ["two", "three"] and not regex.truncated
    capped = alice.tools.search(session.session_id, "e", max_results=1)
    assert len(capped.hits) == 1 and capped.truncated


def test_git_tools(alice: Client, session: Session) -> None:
    ws = session.session_id
    alice.tools.str_replace(ws, "src/app.py", "'old'", "'new'")
    status = alice.tools.git_status(ws)
    assert status.branch == session.workspace.branch_name
    assert [(e.path, e.unstaged) for e in status.entries] == [("src/app.py", "modified")]
    diff = alice.tools.git_diff(ws)
    assert diff.files == ["src/app.py"] and "+    return 'new'" in diff.patch
    committed = alice.tools.git_commit(ws, "say new", author_name="A", author_email="a@example.com")
    assert committed.files == ["src/app.py"] and len(committed.commit) == 40
    log = alice.tools.git_log(ws, max_count=5)
    assert [e.summary for e in log.entries][:2] == ["say new", "initial"]
    assert log.entries[0].author_name == "A"
    assert alice.tools.git_diff(ws, against="base").files == ["src/app.py"]
    assert alice.tools.git_diff(ws, ref="main").files == ["src/app.py"]
    assert alice.tools.git_status(ws).entries == []


def test_git_push_goes_to_the_recorded_remote(grove: Grove, alice: Client, repo_url: str) -> None:
    from .conftest import acquire

    work = grove.repo("pushable-work", {"a.txt": "a\n"}).removeprefix("file://")
    upstream = grove.root / "upstream" / "pushable.git"
    git(grove.root / "upstream", "clone", "-q", "--bare", work, str(upstream))
    s = acquire(alice, f"file://{upstream}")
    alice.tools.write_file(s.session_id, "a.txt", "pushed\n")
    alice.tools.git_commit(s.session_id, "push me")
    pushed = alice.tools.git_push(s.session_id, set_upstream=True)
    assert pushed.branch == s.workspace.branch_name and pushed.previous is None
    assert git(upstream, "rev-parse", pushed.branch).strip() == pushed.commit


def test_the_generic_call_returns_the_tagged_output(alice: Client, session: Session) -> None:
    out = alice.call_tool(session.session_id, "read_file", {"path": "README.md"})
    assert isinstance(out, models.FileOutput) and out.path == "README.md"
    status = alice.call_tool(session.session_id, "git_status")
    assert isinstance(status, models.StatusOutput)


def test_tool_refusals_are_their_kinds(alice: Client, session: Session) -> None:
    ws = session.session_id
    with pytest.raises(ConflictError):
        alice.tools.create(ws, "README.md", "again")
    with pytest.raises(InvalidInputError):
        alice.tools.str_replace(ws, "notes.txt", "not there", "x")
    with pytest.raises(RejectedError):
        alice.tools.git_commit(ws, "nothing to commit")
