"""Each error kind of the envelope arrives as its own exception class, triggered for
real: a wrong token, a malformed id, another user's workspace, a refused edit, a
sandbox over its memory limit, a server without workers, a worker killed mid-command,
a handler that panics."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from grove_client import (
    ApiError,
    Client,
    ConflictError,
    ExecStarted,
    InternalError,
    InvalidInputError,
    NotFoundError,
    RejectedError,
    ResourceLimitError,
    RetryPolicy,
    Session,
    UnauthorizedError,
    UnavailableError,
    WorkerLostError,
    WorkspaceEvictedError,
)

from .conftest import ALICE, BOB, Grove, acquire, start_grove


def test_a_wrong_token_is_unauthorized(grove: Grove) -> None:
    with grove.client("not-a-token") as c, pytest.raises(UnauthorizedError) as e:
        c.list_workspaces()
    assert e.value.status == 401 and e.value.kind == "unauthorized"


def test_a_malformed_id_is_invalid_input(alice: Client) -> None:
    with pytest.raises(InvalidInputError) as e:
        alice.get_workspace("not-a-uuid")
    assert e.value.status == 400 and "GET /v1/workspaces/not-a-uuid" in str(e.value)


def test_a_bad_repo_name_is_invalid_input(alice: Client, repo_url: str) -> None:
    with pytest.raises(InvalidInputError):
        alice.ensure_repo_cache(repo_name="../etc", repo_url=repo_url)


def test_a_missing_workspace_and_another_users_are_both_not_found(
    grove: Grove, alice: Client, session: Session
) -> None:
    with pytest.raises(NotFoundError):
        alice.get_workspace(str(uuid.uuid4()))
    with grove.client(BOB) as bob, pytest.raises(NotFoundError) as e:
        bob.exec(session.session_id, ["true"])
    assert e.value.status == 404
    with pytest.raises(NotFoundError):
        alice.tools.read_file(session.session_id, "no/such/file")


def test_conflict_and_rejected_are_told_apart(alice: Client, session: Session) -> None:
    with pytest.raises(ConflictError) as conflict:
        alice.tools.create(session.session_id, "README.md", "x")
    assert conflict.value.status == 409
    with pytest.raises(RejectedError) as rejected:
        alice.tools.git_commit(session.session_id, "nothing to commit")
    assert rejected.value.status == 422
    assert not isinstance(rejected.value, ConflictError)


def test_a_command_over_the_memory_limit_is_a_resource_limit(
    alice: Client, session: Session
) -> None:
    # `tail -c N` of a pipe keeps its last N bytes: 2.5 GB, over the local runtime's
    # default 2 GiB limit, and bounded where no limit is enforced.
    hog = "head -c 2600000000 /dev/zero | tail -c 2500000000 > /dev/null"
    try:
        r = alice.exec(session.session_id, ["sh", "-c", hog], timeout_ms=60_000)
    except ResourceLimitError as e:
        assert e.status == 429 and e.kind == "resource_limit"
        return
    pytest.skip(f"this runtime enforces no memory limit here (exit {r.exit_code})")


@pytest.fixture(scope="module")
def fleet(
    grove_bin: Path, admin_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Grove, Path]]:
    """A server without an in-process worker; workers are started by the test."""
    g = start_grove(
        grove_bin,
        admin_url,
        tmp_path_factory.mktemp("fleet"),
        args=("--no-worker",),
        env={"GROVE_CLAIM_TIMEOUT": "2"},
    )
    yield g, grove_bin
    g.stop()


def _worker(g: Grove, grove_bin: Path, name: str, **env: str) -> subprocess.Popen[bytes]:
    full = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "DATABASE_URL": g.db_url,
        "GROVE_HOME": str(g.root / "home"),
        "GROVE_LOCAL_REPO_ROOTS": str(g.root),
        "GROVE_EVICT_SCHEDULE": "off",
        "GROVE_LOG": "info",
        **env,
    }
    log = (g.root / f"worker-{name}.log").open("w")
    return subprocess.Popen(
        [str(grove_bin), "worker", "--concurrency", "4"], env=full, stdout=log, stderr=log
    )


def test_no_worker_a_lost_worker_and_a_panic_are_their_kinds(
    fleet: tuple[Grove, Path],
) -> None:
    g, grove_bin = fleet
    workers: list[subprocess.Popen[bytes]] = []
    try:
        with g.client(ALICE, retry=RetryPolicy(max_retries=0)) as alice:
            url = g.repo("fleet", {"a.txt": "a\n"})
            # No worker: the job is withdrawn after the claim timeout, 503.
            with pytest.raises(UnavailableError) as unavailable:
                alice.ensure_repo_cache(repo_name="o/fleet", repo_url=url)
            assert unavailable.value.status == 503

            workers.append(_worker(g, grove_bin, "a"))
            s = acquire(alice, url)
            key = f"lost-{uuid.uuid4()}"
            run = alice.exec_stream(s.session_id, ["sleep", "20"], idempotency_key=key)
            for event in run:
                if isinstance(event, ExecStarted):
                    break
            run.close()
            workers[0].send_signal(signal.SIGKILL)
            workers[0].wait()
            # The next worker finds the dead one's exec and ends it as worker_lost
            # (an exec is never run twice); its panicking handler then fails the next.
            workers.append(
                _worker(g, grove_bin, "b", GROVE_WORKER_LOST_AFTER="1", GROVE_TEST_PANIC_ON="exec")
            )
            assert run.exec_id is not None
            deadline = time.monotonic() + 40
            while (status := alice.get_exec(run.exec_id)).status != "failed":
                assert time.monotonic() < deadline, f"still {status.status}"
                time.sleep(0.2)
            assert status.error is not None and status.error.kind == "worker_lost"
            with pytest.raises(WorkerLostError) as lost:
                alice.exec(s.session_id, ["sleep", "20"], idempotency_key=key)
            assert lost.value.status == 500

            with pytest.raises(InternalError) as internal:
                alice.exec(s.session_id, ["true"])
            assert internal.value.status == 500 and isinstance(internal.value, ApiError)
            # A streamed exec's failure arrives as its `error` event, raised by the
            # iterator as the same class.
            events = []
            with pytest.raises(InternalError), alice.exec_stream(s.session_id, ["true"]) as run:
                for event in run:
                    events.append(event)
            assert isinstance(events[0], ExecStarted) and run.finished is None
    finally:
        for w in workers:
            if w.poll() is None:
                w.terminate()
                try:
                    w.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    w.kill()


def test_an_evicted_workspace_is_a_conflict_until_restored(
    fleet: tuple[Grove, Path],
) -> None:
    g, grove_bin = fleet
    worker = _worker(g, grove_bin, "c", GROVE_ALLOW_CLOCK_OVERRIDE="1")
    try:
        with g.client(ALICE) as alice:
            url = g.repo("fleet", {"a.txt": "a\n"})
            s = acquire(alice, url)
            alice.tools.write_file(s.session_id, "kept.txt", "committed work\n")
            alice.tools.git_commit(s.session_id, "keep")
            alice.release_session(s.session_id, destroy_runtime=True)
            # A sweep planned a century ahead finds the clean, released workspace past
            # its TTL.
            swept = subprocess.run(
                [str(grove_bin), "evict", "--json", "--now", "2126-01-01T00:00:00Z"],
                env={
                    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                    "DATABASE_URL": g.db_url,
                    "GROVE_HOME": str(g.root / "home"),
                },
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert swept.returncode == 0, swept.stderr
            assert alice.get_workspace(s.session_id).state == "evicted", swept.stdout
            with pytest.raises(WorkspaceEvictedError) as evicted:
                alice.tools.read_file(s.session_id, "kept.txt")
            assert isinstance(evicted.value, ConflictError) and evicted.value.status == 409
            restored = alice.restore_workspace(s.session_id)
            assert restored.state == "ready" and restored.id == s.session_id
            assert alice.tools.read_file(s.session_id, "kept.txt").content == "committed work\n"
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
