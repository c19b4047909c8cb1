"""Events: pages, every page, and following the log as it grows."""

from __future__ import annotations

import threading
import time

from grove_client import Client, Event, Session


def test_events_come_a_page_at_a_time(alice: Client, session: Session) -> None:
    ws = session.session_id
    alice.tools.write_file(ws, "e1.txt", "1")
    alice.tools.write_file(ws, "e2.txt", "2")
    page = alice.events(ws, limit=1)
    assert len(page.events) == 1 and page.next_after == page.events[0].position
    assert page.events[0].event_type == "workspace.created"
    assert page.events[0].recorded_at.tzinfo is not None
    every = list(alice.iter_events(ws, page_size=2))
    types = [e.event_type for e in every]
    assert types.count("workspace.file_written") == 2
    positions = [e.position for e in every]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    rest = alice.events(ws, after=every[-1].position)
    assert rest.events == []


def test_following_yields_events_as_they_are_appended(alice: Client, session: Session) -> None:
    ws = session.session_id
    start = alice.events(ws).events[-1].position
    got: list[Event] = []

    def write_later() -> None:
        time.sleep(0.5)
        alice.tools.write_file(ws, "followed.txt", "x")

    writer = threading.Thread(target=write_later)
    with alice.follow_events(ws, after=start) as stream:
        writer.start()
        for event in stream:
            got.append(event)
            if event.event_type == "workspace.file_written":
                break
    writer.join()
    assert got[-1].payload["path"] == "followed.txt"
    assert all(e.position > start for e in got)
    assert stream.position == got[-1].position
