"""The shared core without a server: the SSE decoder, model parsing, the retry rule."""

from __future__ import annotations

from datetime import timezone

import httpx
import pytest

from grove_client import ProtocolError, RetryPolicy, models
from grove_client._core import Op, SseDecoder, parse_none, retry_delay


def test_the_sse_decoder_follows_the_event_stream_format() -> None:
    d = SseDecoder()
    lines = [
        ": keep-alive",
        "",
        "event: output",
        "id: 3",
        'data: {"a":',
        "data: 1}",
        "",
        "data:no space",
        "",
        "retry: 10",
        "event: finished",
        "data: {}",
        "",
    ]
    msgs = d.feed_all(lines)
    assert [(m.event, m.data, m.id) for m in msgs] == [
        ("output", '{"a":\n1}', "3"),
        ("message", "no space", None),
        ("finished", "{}", None),
    ]
    assert d.last_id == "3"


def test_models_parse_grove_times_and_ignore_unknown_fields() -> None:
    e = models.from_json(
        models.Event,
        {
            "position": 1,
            "stream_id": "s",
            "stream_version": 1,
            "event_type": "x",
            "event_version": 1,
            "payload": {},
            "metadata": {},
            "recorded_at": "2026-12-05T23:46:22.123456789Z",
            "new_field": [1, 2],
        },
    )
    assert e.recorded_at.tzinfo == timezone.utc and e.recorded_at.microsecond == 123456


def test_models_name_the_field_that_is_wrong() -> None:
    with pytest.raises(ProtocolError, match="missing required field 'exit_code'"):
        models.from_json(models.ExecFinished, {"exec_id": "e"})
    with pytest.raises(ProtocolError, match=r"ExecOutput\.text: expected a string"):
        models.from_json(models.ExecOutput, {"stream": "stdout", "text": 3})
    with pytest.raises(ProtocolError, match="unknown tool output"):
        models.tool_output({"output": "hologram"})


def answer(status: int, body: bytes = b"", retry_after: str | None = None) -> httpx.Response:
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return httpx.Response(status, content=body, headers=headers)


def test_the_retry_rule() -> None:
    policy = RetryPolicy(max_retries=2, backoff=0.1, max_retry_after=5)
    unsafe: Op[None] = Op("POST", "/x", parse_none)
    safe: Op[None] = Op("GET", "/x", parse_none, repeatable=True)
    grove_503 = answer(503, b'{"error": {"kind": "unavailable", "message": "m"}}')
    assert retry_delay(policy, 0, grove_503, unsafe) is None
    assert 0.1 <= (retry_delay(policy, 0, grove_503, safe) or 0) <= 0.125
    assert 0.2 <= (retry_delay(policy, 1, grove_503, safe) or 0) <= 0.25
    assert retry_delay(policy, 2, grove_503, safe) is None
    assert retry_delay(policy, 0, answer(503, b"<html>"), unsafe) is not None
    assert retry_delay(policy, 0, answer(429, retry_after="4"), safe) == 4.0
    assert retry_delay(policy, 0, answer(429, retry_after="6"), safe) is None
    assert retry_delay(policy, 0, answer(500), safe) is None


def test_a_client_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from grove_client import AsyncClient, Client

    monkeypatch.delenv("GROVE_URL", raising=False)
    monkeypatch.setenv("GROVE_TOKEN", "env-token-0123456789")
    with pytest.raises(ValueError, match="GROVE_URL not set"):
        Client.from_env()
    monkeypatch.setenv("GROVE_URL", "http://127.0.0.1:8080")
    with Client.from_env() as c:
        assert c.base_url == "http://127.0.0.1:8080" and "env-token" not in repr(c)
    assert isinstance(AsyncClient.from_env(), AsyncClient)


def test_errors_cross_processes() -> None:
    import pickle

    from grove_client import ConflictError
    from grove_client.errors import error_for

    e = error_for(status=409, kind="conflict", message="m", paths=("a",), request="POST /x")
    back = pickle.loads(pickle.dumps(e))
    assert isinstance(back, ConflictError) and back.paths == ("a",) and str(back) == str(e)
