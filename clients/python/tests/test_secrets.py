"""The bearer token and git tokens never show: not in a repr or str, an exception, a
traceback, or any log record of the client or httpx, even at DEBUG."""

from __future__ import annotations

import logging
import pickle
import traceback

import pytest

from grove_client import ApiError, Client, RetryPolicy, Secret, Session, TransportError

from .conftest import ALICE, Grove

GIT_TOKEN = "ghp_gittoken_never_to_be_seen_0123456789"


def test_reprs_hide_the_token(grove: Grove) -> None:
    with grove.client(ALICE) as c:
        for text in (repr(c), str(c), repr(c.__dict__), repr(vars(c.tools))):
            assert ALICE not in text
        assert repr(Secret(ALICE)) == "Secret('***')"
        with pytest.raises(TypeError):
            pickle.dumps(Secret(ALICE))


def test_no_token_in_exceptions_or_logs(
    grove: Grove, session: Session, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    texts: list[str] = []
    wrong = "wrong-bearer-token-also-secret-0123456789"
    with grove.client(ALICE) as c:
        c.exec(session.session_id, ["true"])
        # A git token sent to a tool that refuses the call.
        with pytest.raises(ApiError) as push:
            c.tools.git_push(session.session_id, branch="no-such-branch", git_token=GIT_TOKEN)
        texts += [
            str(push.value),
            repr(push.value),
            "".join(traceback.format_exception(push.value)),
        ]
        texts.append(repr(vars(push.value)))
    with grove.client(wrong) as bad, pytest.raises(ApiError) as unauthorized:
        bad.get_workspace(session.session_id)
    texts += [str(unauthorized.value), "".join(traceback.format_exception(unauthorized.value))]
    with (
        Client("http://127.0.0.1:9", ALICE, retry=RetryPolicy(backoff=0.01)) as down,
        pytest.raises(TransportError) as transport,
    ):
        down.list_workspaces()
    texts += [str(transport.value), "".join(traceback.format_exception(transport.value))]
    for record in caplog.records:
        texts.append(record.getMessage())
        texts.append(repr(record.args))
    assert any("HTTP Request" in t for t in texts), "httpx logged nothing: the check saw no logs"
    for t in texts:
        for secret in (ALICE, GIT_TOKEN, wrong):
            assert secret not in t, f"a token leaked into: {t[:200]}"
