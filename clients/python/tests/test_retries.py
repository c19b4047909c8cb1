"""Retries of 429 and 503: bounded, honouring `Retry-After`, and never repeating a
command that could run twice. The 503s and 429s come from a real loopback proxy in
front of the real server (grove's own 503s are tested in test_errors.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from email.utils import formatdate

import pytest

from grove_client import (
    Client,
    ResourceLimitError,
    RetryPolicy,
    Session,
    TransportError,
    UnavailableError,
)
from grove_client._core import retry_after

from .conftest import ALICE, Grove
from .proxy import Canned, FlakyProxy

GROVE_503 = json.dumps({"error": {"kind": "unavailable", "message": "no worker"}}).encode()
GROVE_429 = json.dumps({"error": {"kind": "resource_limit", "message": "slow down"}}).encode()


@pytest.fixture
def proxy(grove: Grove) -> Iterator[FlakyProxy]:
    p = FlakyProxy(grove.base_url)
    yield p
    p.close()


def client(proxy: FlakyProxy, **policy: float) -> Client:
    return Client(proxy.url, ALICE, retry=RetryPolicy(**policy))  # type: ignore[arg-type]


def test_a_read_is_retried_after_the_time_retry_after_asks(
    proxy: FlakyProxy, session: Session
) -> None:
    proxy.canned = [Canned(503, b"busy", retry_after="1"), Canned(429, b"", retry_after="0")]
    with client(proxy) as c:
        started = time.monotonic()
        ws = c.get_workspace(session.session_id)
    assert ws.id == session.session_id
    assert len(proxy.seen) == 3
    assert proxy.seen[1].at - proxy.seen[0].at >= 0.95
    assert time.monotonic() - started < 10


def test_retries_are_bounded(proxy: FlakyProxy, session: Session) -> None:
    proxy.canned = [Canned(503, b"busy", retry_after="0") for _ in range(5)]
    with client(proxy, max_retries=2) as c, pytest.raises(UnavailableError) as e:
        c.get_workspace(session.session_id)
    assert len(proxy.seen) == 3 and e.value.status == 503 and e.value.kind is None


def test_a_retry_after_beyond_the_cap_is_raised_at_once(
    proxy: FlakyProxy, session: Session
) -> None:
    proxy.canned = [Canned(429, b"", retry_after="3600")]
    with client(proxy, max_retry_after=5) as c, pytest.raises(ResourceLimitError):
        started = time.monotonic()
        c.get_workspace(session.session_id)
    assert len(proxy.seen) == 1 and time.monotonic() - started < 2


def test_without_retry_after_the_backoff_grows(proxy: FlakyProxy, session: Session) -> None:
    proxy.canned = [Canned(503), Canned(503)]
    with client(proxy, backoff=0.2) as c:
        c.get_workspace(session.session_id)
    gaps = [b.at - a.at for a, b in zip(proxy.seen, proxy.seen[1:], strict=False)]
    assert len(gaps) == 2 and gaps[0] >= 0.2 and gaps[1] >= 0.4


def test_an_exec_without_a_key_is_not_repeated_after_grove_refused_it(
    proxy: FlakyProxy, session: Session
) -> None:
    proxy.canned = [Canned(503, GROVE_503, retry_after="0", content_type="application/json")]
    with client(proxy) as c, pytest.raises(UnavailableError) as e:
        c.exec(session.session_id, ["true"])
    assert len(proxy.seen) == 1 and e.value.kind == "unavailable"


def test_an_exec_with_a_key_is_repeated_with_the_same_key(
    proxy: FlakyProxy, session: Session
) -> None:
    proxy.canned = [Canned(429, GROVE_429, retry_after="0", content_type="application/json")]
    with client(proxy) as c:
        r = c.exec(session.session_id, ["echo", "once"], idempotency_key="retry-key-1")
    assert r.stdout == "once\n" and len(proxy.seen) == 2
    keys = {json.loads(s.body)["idempotency_key"] for s in proxy.seen}
    assert keys == {"retry-key-1"}


def test_a_503_from_in_front_of_grove_is_retried_for_any_request(
    proxy: FlakyProxy, session: Session
) -> None:
    # No grove envelope: the request never reached grove, so even an exec is resent.
    proxy.canned = [Canned(503, b"<html>bad gateway</html>", retry_after="0")]
    with client(proxy) as c:
        assert c.exec(session.session_id, ["true"]).exit_code == 0
    assert len(proxy.seen) == 2


def test_a_stream_is_retried_before_it_opens(proxy: FlakyProxy, session: Session) -> None:
    proxy.canned = [Canned(503, b"", retry_after="0")]
    with client(proxy) as c:
        page = c.events(session.session_id)
    assert page.events and len(proxy.seen) == 2


def test_a_refused_connection_is_retried_then_raised() -> None:
    with Client("http://127.0.0.1:9", ALICE, retry=RetryPolicy(max_retries=1, backoff=0.01)) as c:
        with pytest.raises(TransportError) as e:
            c.list_workspaces()
    assert "cannot connect" in str(e.value)


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert retry_after("7") == 7.0
    assert retry_after(None) is None and retry_after("soon") is None
    now = time.time()
    assert 9 <= (retry_after(formatdate(now + 10, usegmt=True), now=now) or 0) <= 11
    assert retry_after(formatdate(now - 10, usegmt=True), now=now) == 0.0


def test_a_followed_stream_that_drops_resumes_after_the_last_event(
    proxy: FlakyProxy, session: Session
) -> None:
    with client(proxy, backoff=0.05) as c:
        ws = session.session_id
        for i in range(3):
            c.tools.write_file(ws, f"resume-{i}.txt", str(i))
        every = [e.position for e in c.iter_events(ws)]
        proxy.cut_follow_after = 2
        seen: list[int] = []
        with c.follow_events(ws) as stream:
            for event in stream:
                seen.append(event.position)
                if len(seen) == len(every):
                    break
    assert seen == every, "an event was lost or repeated across the reconnect"
    follows = [s.path for s in proxy.seen if "follow=true" in s.path]
    assert len(follows) == 2 and f"after={every[1]}" in follows[1]
