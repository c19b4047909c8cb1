"""Interactive sessions: a long-lived shell written to and polled."""

from __future__ import annotations

import time

from grove_client import Client, Session


def test_a_shell_is_written_to_polled_and_killed(alice: Client, session: Session) -> None:
    ws = session.session_id
    sh = alice.start_interactive(ws, ["sh"], env={"X": "42"})
    assert sh.workspace_id == ws and sh.argv == ["sh"] and sh.exit is None
    assert sh.id in {s.id for s in alice.list_interactive(ws)}
    alice.write_interactive(ws, sh.id, 'echo "x=$X"\n')
    text = ""
    deadline = time.monotonic() + 20
    while "x=42" not in text:
        assert time.monotonic() < deadline, f"no output; got {text!r}"
        poll = alice.poll_interactive(ws, sh.id, wait_ms=2000)
        text += poll.data
    alice.kill_interactive(ws, sh.id)
    deadline = time.monotonic() + 20
    while (poll := alice.poll_interactive(ws, sh.id, wait_ms=1000)).exit is None:
        assert time.monotonic() < deadline
    assert poll.exit.killed and poll.exit.exit_code == 137


def test_closing_stdin_ends_the_process(alice: Client, session: Session) -> None:
    ws = session.session_id
    cat = alice.start_interactive(ws, ["cat"])
    alice.write_interactive(ws, cat.id, "bye\n", close=True)
    text, deadline = "", time.monotonic() + 20
    while True:
        poll = alice.poll_interactive(ws, cat.id, wait_ms=1000)
        text += poll.data
        if poll.exit is not None:
            break
        assert time.monotonic() < deadline
    assert text == "bye\n" and poll.exit.exit_code == 0 and not poll.exit.killed
