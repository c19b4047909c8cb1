"""The async client against the same real server: the same answers, streams as async
iterators, the same exceptions."""

from __future__ import annotations

import asyncio

import pytest

from grove_client import (
    AsyncClient,
    ExecOutput,
    InvalidInputError,
    NotFoundError,
    RejectedError,
    RetryPolicy,
    models,
)

from .conftest import ALICE, Grove
from .proxy import Canned, FlakyProxy

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def acquire(c: AsyncClient, repo_url: str, conversation: str) -> str:
    s = await c.acquire_session(
        project_id="p1",
        repo_name="o/fixture",
        repo_url=repo_url,
        base_ref="main",
        mode="edit",
        conversation_id=conversation,
    )
    return s.session_id


async def test_sessions_exec_and_tools(grove: Grove, repo_url: str) -> None:
    async with grove.aclient() as c:
        ws = await acquire(c, repo_url, "async-1")
        assert (await c.get_workspace(ws)).id == ws
        r = await c.exec(ws, ["echo", "async"])
        assert r.stdout == "async\n"
        written = await c.tools.write_file(ws, "a.txt", "a\n")
        assert isinstance(written, models.WrittenOutput)
        assert (await c.tools.read_file(ws, "a.txt")).content == "a\n"
        with pytest.raises(InvalidInputError):
            await c.tools.str_replace(ws, "a.txt", "zzz", "y")
        await c.tools.git_commit(ws, "a")
        with pytest.raises(RejectedError):
            await c.tools.git_commit(ws, "nothing to commit")
        with pytest.raises(NotFoundError):
            await c.get_exec("00000000-0000-0000-0000-000000000000")
        ids = [w.id async for w in c.iter_workspaces(page_size=1)]
        assert ws in ids


async def test_streams_are_async_iterators(grove: Grove, repo_url: str) -> None:
    async with grove.aclient() as c:
        ws = await acquire(c, repo_url, "async-2")
        async with await c.exec_stream(ws, ["sh", "-c", "echo a; sleep 0.3; echo b"]) as run:
            texts = [e.text async for e in run if isinstance(e, ExecOutput)]
        assert "".join(texts) == "a\nb\n" and run.finished is not None
        start = (await c.events(ws)).events[-1].position

        async def write_later() -> None:
            await asyncio.sleep(0.3)
            await c.tools.write_file(ws, "f.txt", "f")

        task = asyncio.create_task(write_later())
        async with await c.follow_events(ws, after=start) as stream:
            async for event in stream:
                if event.event_type == "workspace.file_written":
                    break
        await task
        every = [e async for e in c.iter_events(ws, page_size=3)]
        assert every[-1].event_type in (
            "workspace.file_written",
            "workspace.dirty_changed",
            "workspace.snapshot_taken",
        )


async def test_concurrent_calls_share_one_client(grove: Grove, repo_url: str) -> None:
    async with grove.aclient() as c:
        ws = await acquire(c, repo_url, "async-3")
        results = await asyncio.gather(
            *(c.exec(ws, ["echo", str(i)], kind="read") for i in range(4))
        )
        assert sorted(r.stdout for r in results) == [f"{i}\n" for i in range(4)]


async def test_async_retries_and_a_resumed_stream(grove: Grove, repo_url: str) -> None:
    proxy = FlakyProxy(grove.base_url)
    try:
        async with AsyncClient(
            proxy.url, ALICE, retry=RetryPolicy(max_retries=2, backoff=0.05)
        ) as c:
            ws = await acquire(c, repo_url, "async-4")
            proxy.canned = [Canned(503, b"", retry_after="0"), Canned(429, b"")]
            assert (await c.get_workspace(ws)).id == ws
            assert len([s for s in proxy.seen if s.path == f"/v1/workspaces/{ws}"]) == 3
            await c.tools.write_file(ws, "r.txt", "r")
            every = [e.position async for e in c.iter_events(ws)]
            proxy.cut_follow_after = 1
            seen: list[int] = []
            async with await c.follow_events(ws) as stream:
                async for event in stream:
                    seen.append(event.position)
                    if len(seen) == len(every):
                        break
            assert seen == every
            assert len([s for s in proxy.seen if "follow=true" in s.path]) == 2
    finally:
        proxy.close()
