"""Workspace history through the SDK: checkpoint, diff, a file at a point, undo, rewind
and fork, each against a real workspace (ADR 28)."""

from __future__ import annotations

import uuid

import pytest

from grove_client import Client, NotFoundError, Session


def test_checkpoint_diff_undo_rewind_and_fork(alice: Client, session: Session) -> None:
    ws = session.session_id
    start = alice.tools.checkpoint(ws, "start")
    assert start.operation["kind"] == "checkpoint" and start.workspace_id == ws
    alice.tools.write_file(ws, "notes.txt", "changed\n")

    diff = alice.tools.history_diff(ws, str(start.number))
    assert [(f.path, f.status) for f in diff.files] == [("notes.txt", "modified")]
    assert "+changed" in diff.patch and diff.to_point is None
    then = alice.tools.history_file(ws, str(start.number), "notes.txt")
    assert then.content == "one\ntwo\nthree\n"

    undone = alice.tools.undo(ws)
    assert undone.to == start.number and undone.files_written == 1
    assert alice.tools.read_file(ws, "notes.txt").content == "one\ntwo\nthree\n"

    timeline = alice.tools.history(ws)
    numbers = [p.number for p in timeline.points]
    assert numbers == list(range(timeline.total)) and timeline.total >= 4
    assert timeline.points[0].operation["kind"] == "created"

    alice.tools.write_file(ws, "extra.txt", "x\n")
    rewound = alice.tools.rewind(ws, str(start.number))
    assert rewound.to == start.number and rewound.files_removed == 1
    assert alice.tools.list_dir(ws).entries and not any(
        e.path == "extra.txt" for e in alice.tools.list_dir(ws).entries
    )

    scope = f"c-{uuid.uuid4().hex[:12]}"
    forked = alice.tools.fork(ws, str(start.number), scope)
    assert forked.point == start.number and forked.workspace_id != ws
    assert forked.branch == f"agent/edits-{scope}"
    assert alice.tools.read_file(forked.workspace_id, "notes.txt").content == "one\ntwo\nthree\n"


def test_an_unknown_point_is_not_found(alice: Client, session: Session) -> None:
    with pytest.raises(NotFoundError):
        alice.tools.history_file(session.session_id, "9999", "notes.txt")


def test_a_session_acquired_with_history_ignored_keeps_ignored_files_in_its_points(
    alice: Client, repo_url: str
) -> None:
    def session(history_ignored: bool) -> Session:
        return alice.acquire_session(
            project_id="p1",
            repo_name="o/fixture",
            repo_url=repo_url,
            base_ref="main",
            mode="edit",
            conversation_id=f"c-{uuid.uuid4().hex[:12]}",
            history_ignored=history_ignored,
        )

    kept, plain = session(True), session(False)
    assert kept.workspace.history_ignored and not plain.workspace.history_ignored
    for s in (kept, plain):
        alice.tools.write_file(s.session_id, ".gitignore", "*.log\n")
        alice.tools.write_file(s.session_id, "build.log", "output\n")
    added = [alice.tools.history(s.session_id).points[-1].changes["added"] for s in (kept, plain)]
    assert added == [1, 0]
    assert alice.get_workspace(kept.session_id).history_ignored
