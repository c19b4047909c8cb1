"""Runs last (by name): every operation of docs/openapi.json was exercised against the
server by this session's tests, through the SDK. Only meaningful for a whole run; a
partial one (`-k`, one file) skips it."""

from __future__ import annotations

import json

import pytest

from .conftest import EXERCISED
from .test_contract import DOC_PATH, METHODS


def test_every_operation_was_exercised_against_a_real_server(
    request: pytest.FixtureRequest,
) -> None:
    modules = {item.path.stem for item in request.session.items}
    here = {p.stem for p in request.path.parent.glob("test_*.py")}
    if modules != here:
        pytest.skip("a partial run: the coverage of operations is checked on whole runs")
    doc = json.loads(DOC_PATH.read_text())
    documented = {
        (method.upper(), path)
        for path, item in doc["paths"].items()
        for method in item
        if method in METHODS
    }
    missed = sorted(f"{m} {p}" for m, p in documented - EXERCISED)
    assert not missed, "operations no test sent to the server:\n" + "\n".join(missed)
