"""exec, collected and streamed, against a real server and a real sandbox."""

from __future__ import annotations

import time
import uuid

import pytest

from grove_client import Client, ExecFinished, ExecOutput, ExecStarted, Session


def test_exec_returns_the_result_and_a_failing_command_is_a_result(
    alice: Client, session: Session
) -> None:
    r = alice.exec(session.session_id, ["cat", "README.md"])
    assert r.exit_code == 0 and "hello world" in r.stdout and not r.timed_out
    bad = alice.exec(session.session_id, ["sh", "-c", "echo oops >&2; exit 3"])
    assert bad.exit_code == 3 and bad.stderr == "oops\n"


def test_exec_takes_stdin_env_and_cwd(alice: Client, session: Session) -> None:
    r = alice.exec(
        session.session_id,
        ["sh", "-c", 'cat; echo "$GREETING"; pwd'],
        stdin="from stdin\n",
        env={"GREETING": "hi"},
        cwd="src",
    )
    lines = r.stdout.splitlines()
    assert lines[0] == "from stdin" and lines[1] == "hi" and lines[2].endswith("/src")


def test_a_command_over_its_timeout_is_killed(alice: Client, session: Session) -> None:
    r = alice.exec(session.session_id, ["sleep", "30"], timeout_ms=300)
    assert r.timed_out


def test_one_idempotency_key_runs_the_command_once(alice: Client, session: Session) -> None:
    key = f"exec-{uuid.uuid4()}"
    argv = ["sh", "-c", "echo x >> counter.txt; wc -l < counter.txt"]
    first = alice.exec(session.session_id, argv, idempotency_key=key)
    again = alice.exec(session.session_id, argv, idempotency_key=key)
    assert first.exec_id == again.exec_id and first.stdout == again.stdout == "1\n"
    status = alice.get_exec(first.exec_id)
    assert status.status == "succeeded" and status.result is not None
    assert status.result.stdout == "1\n" and status.workspace_id == session.session_id


def test_streamed_output_arrives_while_the_command_runs(alice: Client, session: Session) -> None:
    seen: list[tuple[float, object]] = []
    with alice.exec_stream(
        session.session_id, ["sh", "-c", "echo first; sleep 1.5; echo second >&2"]
    ) as run:
        for event in run:
            seen.append((time.monotonic(), event))
    kinds = [type(e).__name__ for _, e in seen]
    assert kinds[0] == "ExecStarted" and kinds[-1] == "ExecFinished"
    outputs = [(t, e) for t, e in seen if isinstance(e, ExecOutput)]
    assert outputs[0][1].text == "first\n" and outputs[0][1].stream == "stdout"
    # The first chunk came well before the end: it was streamed, not collected.
    assert seen[-1][0] - outputs[0][0] > 1.0
    assert run.finished is not None and run.finished.exit_code == 0
    assert run.exec_id == run.finished.exec_id
    assert "".join(run.stderr) == "second\n"


def test_a_stream_can_be_collected_into_the_result(alice: Client, session: Session) -> None:
    run = alice.exec_stream(session.session_id, ["sh", "-c", "echo out; echo err >&2; exit 5"])
    r = run.result()
    assert (r.exit_code, r.stdout, r.stderr) == (5, "out\n", "err\n")
    assert alice.get_exec(r.exec_id).result == r


def test_leaving_a_stream_early_lets_the_command_finish(alice: Client, session: Session) -> None:
    with alice.exec_stream(
        session.session_id, ["sh", "-c", "echo started; sleep 0.5; echo done > left.txt"]
    ) as run:
        for event in run:
            if isinstance(event, ExecStarted):
                continue
            break
    assert run.exec_id is not None
    deadline = time.monotonic() + 20
    while alice.get_exec(run.exec_id).status != "succeeded":
        assert time.monotonic() < deadline, "the exec did not finish after its stream closed"
        time.sleep(0.1)
    assert alice.tools.read_file(session.session_id, "left.txt").content == "done\n"


def test_argv_must_be_a_list(alice: Client, session: Session) -> None:
    with pytest.raises(TypeError):
        alice.exec(session.session_id, "ls -l")


def test_finished_is_typed(alice: Client, session: Session) -> None:
    events = list(alice.exec_stream(session.session_id, ["true"]))
    assert isinstance(events[-1], ExecFinished) and events[-1].duration_ms >= 0
