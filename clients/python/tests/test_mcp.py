"""The workspace's MCP endpoint through `Client.mcp`: one JSON-RPC message per call,
with the same tokens and tenancy as the rest of the API. (grove's own suite drives it
with the official MCP SDK: tests/mcp_sdk.)"""

from __future__ import annotations

import pytest

from grove_client import Client, NotFoundError, Session

from .conftest import BOB, Grove


def rpc(id: int, method: str, params: dict[str, object] | None = None) -> dict[str, object]:
    return {"jsonrpc": "2.0", "id": id, "method": method, "params": params or {}}


def test_initialize_list_and_call_a_tool(alice: Client, session: Session) -> None:
    ws = session.session_id
    init = alice.mcp(
        ws,
        rpc(
            1,
            "initialize",
            {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "grove-client-tests", "version": "0"},
            },
        ),
    )
    assert init is not None and init["id"] == 1 and "serverInfo" in init["result"]
    notified = alice.mcp(ws, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    assert notified is None
    listed = alice.mcp(ws, rpc(2, "tools/list"))
    assert listed is not None
    tools = {t["name"]: t for t in listed["result"]["tools"]}
    assert "read_file" in tools and "outputSchema" in tools["read_file"]
    called = alice.mcp(
        ws, rpc(3, "tools/call", {"name": "read_file", "arguments": {"path": "README.md"}})
    )
    assert called is not None
    result = called["result"]
    assert not result.get("isError") and "hello world" in result["structuredContent"]["content"]
    unknown = alice.mcp(ws, rpc(4, "no/such/method"))
    assert unknown is not None and unknown["error"]["code"] == -32601


def test_another_users_workspace_is_not_found(grove: Grove, session: Session) -> None:
    with grove.client(BOB) as bob, pytest.raises(NotFoundError):
        bob.mcp(session.session_id, rpc(1, "tools/list"))
