"""grove's MCP server driven by the official MCP Python SDK over every transport it
offers: streamable HTTP (`/v1/workspaces/{id}/mcp` of `grove serve`), stdio as a thin
client of that server (`grove mcp` with GROVE_URL, no database credentials), and stdio
over the database (`grove mcp` with DATABASE_URL). The SDK validates every successful
result's structuredContent against the tool's declared outputSchema, so each call
below also checks that schema against a real answer."""

from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator

import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from conftest import ALICE, BOB, GROVE, Grove

TRANSPORTS = ["http", "stdio-server", "stdio-database"]


@contextlib.asynccontextmanager
async def connect(grove: Grove, transport: str, token: str = ALICE) -> AsyncIterator[ClientSession]:
    async with contextlib.AsyncExitStack() as stack:
        if transport == "http":
            http = await stack.enter_async_context(
                httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120)
            )
            streams = await stack.enter_async_context(
                streamable_http_client(f"{grove.base}/v1/workspaces/{grove.workspace}/mcp", http_client=http)
            )
        else:
            if transport == "stdio-server":
                env = grove.env(GROVE_URL=grove.base, GROVE_TOKEN=token)
            else:
                env = grove.env(DATABASE_URL=grove.database_url, GROVE_HOME=str(grove.home))
            params = StdioServerParameters(command=str(GROVE), args=["mcp", "--workspace", grove.workspace], env=env)
            streams = await stack.enter_async_context(stdio_client(params))
        session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
        await session.initialize()
        yield session


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(asyncio.wait_for(coro, timeout=180))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_every_tool_is_listed_with_its_input_and_output_schema(grove: Grove, transport: str) -> None:
    async def go() -> None:
        async with connect(grove, transport) as s:
            tools = {t.name: t for t in (await s.list_tools()).tools}
            for name in ["view", "read_file", "write_file", "list_dir", "search", "git_status",
                         "git_diff", "git_log", "git_commit", "shell"]:
                assert name in tools, name
                assert tools[name].input_schema["type"] == "object", name
                assert tools[name].output_schema is not None, f"{name} declares no outputSchema"
    run(go())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_files_round_trip_and_every_read_tool_answers_in_its_schema(grove: Grove, transport: str) -> None:
    path = f"notes-{transport}.txt"

    async def go() -> None:
        async with connect(grove, transport) as s:
            written = await s.call_tool("write_file", {"path": path, "content": "alpha beta\n"})
            assert not written.is_error, written
            assert written.structured_content["output"] == "written"
            read = await s.call_tool("read_file", {"path": path})
            assert read.structured_content["content"] == "alpha beta\n"
            for tool, args in [
                ("view", {"path": path}),
                ("list_dir", {"path": "."}),
                ("search", {"pattern": "alpha"}),
                ("git_status", {}),
                ("git_diff", {}),
                ("git_log", {"max_count": 5}),
            ]:
                result = await s.call_tool(tool, args)
                assert not result.is_error, (tool, result.content)
            hits = (await s.call_tool("search", {"pattern": "alpha"})).structured_content["hits"]
            assert any(h["path"] == path for h in hits), hits

    run(go())
    assert (grove.workspace_path / path).read_text() == "alpha beta\n"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_shell_reports_the_exit_code_and_124_for_a_timeout(grove: Grove, transport: str) -> None:
    async def go() -> None:
        async with connect(grove, transport) as s:
            ran = await s.call_tool("shell", {"command": "echo out; echo err >&2; exit 3"})
            assert ran.structured_content["exit_code"] == 3
            assert ran.structured_content["stdout"] == "out\n"
            assert ran.content[0].text.startswith("exit code 3")
            slow = await s.call_tool("shell", {"command": "sleep 30", "timeout_secs": 1})
            assert slow.structured_content["timed_out"] is True
            assert slow.content[0].text.startswith("exit code 124 (timed out)"), slow.content
    run(go())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_path_out_of_the_workspace_is_a_tool_error(grove: Grove, transport: str) -> None:
    async def go() -> None:
        async with connect(grove, transport) as s:
            for tool, args in [
                ("read_file", {"path": "../../../../etc/passwd"}),
                ("write_file", {"path": "/tmp/grove-mcp-sdk-escape", "content": "x"}),
            ]:
                result = await s.call_tool(tool, args)
                assert result.is_error, (tool, result)
                assert result.content[0].text.startswith("invalid_input:"), result.content
                assert "root:" not in result.content[0].text
    run(go())


@pytest.mark.parametrize("transport", ["http", "stdio-server"])
def test_another_users_token_reaches_nothing(grove: Grove, transport: str) -> None:
    before = sorted(p.name for p in grove.workspace_path.iterdir())

    async def go() -> None:
        async with connect(grove, transport, token=BOB) as s:
            await s.call_tool("write_file", {"path": "bob.txt", "content": "bob"})

    with pytest.raises(BaseException) as refused:
        run(go())
    # Over HTTP the route answers 404 before any MCP; the thin client exits (code 3,
    # not_found) before the handshake, so the SDK sees its stdio close.
    expected = "Not Found" if transport == "http" else "Connection closed"
    assert expected in repr(refused.value), repr(refused.value)
    assert sorted(p.name for p in grove.workspace_path.iterdir()) == before
