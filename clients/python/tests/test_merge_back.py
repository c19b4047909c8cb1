"""Merge-back from a task workspace into an edit workspace: the diff, the merge, and a
conflict that names every conflicting path."""

from __future__ import annotations

import pytest

from grove_client import Client, ConflictError, RejectedError

from .conftest import acquire


def test_a_task_is_diffed_then_merged_back(alice: Client, repo_url: str) -> None:
    edit = acquire(alice, repo_url).session_id
    task = acquire(alice, repo_url, mode="task").session_id
    alice.tools.write_file(task, "feature.txt", "feature\n")
    alice.tools.git_commit(task, "add feature")
    diff = alice.merge_back_diff(edit, task)
    assert diff.commits_total == 1 and [c.summary for c in diff.commits] == ["add feature"]
    assert [(f.path, f.status) for f in diff.files] == [("feature.txt", "added")]
    assert diff.fast_forward and not diff.up_to_date and not diff.task_dirty
    key = f"mb-{task}"
    done = alice.merge_back(edit, task_workspace_id=task, strategy="merge", idempotency_key=key)
    assert done.files == ["feature.txt"] and done.new_head != done.previous_head
    assert done.fast_forward and done.strategy == "merge"
    assert alice.tools.read_file(edit, "feature.txt").content == "feature\n"
    # The same key is the same merge-back: its outcome again, nothing new.
    again = alice.merge_back(edit, task_workspace_id=task, strategy="merge", idempotency_key=key)
    assert again == done
    assert alice.merge_back_diff(edit, task).up_to_date


def test_a_conflict_names_its_paths_and_changes_nothing(alice: Client, repo_url: str) -> None:
    edit = acquire(alice, repo_url).session_id
    task = acquire(alice, repo_url, mode="task").session_id
    alice.tools.str_replace(edit, "notes.txt", "two", "TWO (edit)")
    alice.tools.git_commit(edit, "edit side")
    alice.tools.str_replace(task, "notes.txt", "two", "two (task)")
    alice.tools.git_commit(task, "task side")
    before = alice.tools.git_log(edit, max_count=1).entries[0].commit
    with pytest.raises(ConflictError) as e:
        alice.merge_back(edit, task_workspace_id=task, strategy="merge")
    assert e.value.paths == ("notes.txt",) and e.value.status == 409
    assert alice.tools.git_log(edit, max_count=1).entries[0].commit == before


def test_uncommitted_edits_refuse_a_merge_back_with_their_paths(
    alice: Client, repo_url: str
) -> None:
    edit = acquire(alice, repo_url).session_id
    task = acquire(alice, repo_url, mode="task").session_id
    alice.tools.str_replace(task, "notes.txt", "one", "ONE")
    alice.tools.git_commit(task, "t")
    alice.tools.str_replace(edit, "notes.txt", "three", "uncommitted")
    with pytest.raises(RejectedError) as e:
        alice.merge_back(edit, task_workspace_id=task, strategy="merge")
    assert e.value.paths == ("notes.txt",) and e.value.status == 422
