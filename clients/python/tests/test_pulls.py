"""Pull requests through a server pointed at a fake GitHub on loopback (the one
service this machine cannot reach): open, read, comment; a wrong token is
auth_failed; the platform's rate limit is grove's 429, retried by the client."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from grove_client import (
    AuthFailedError,
    Client,
    ConflictError,
    ResourceLimitError,
    RetryPolicy,
)

from .conftest import ALICE, Grove, git, start_grove
from .fake_github import FakeGitHub

TOKEN = f"ghp_{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def platform(
    grove_bin: Path, admin_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Grove, FakeGitHub, str]]:
    fake = FakeGitHub(TOKEN)
    root = tmp_path_factory.mktemp("pulls")
    g = start_grove(grove_bin, admin_url, root, env={"GROVE_GITHUB_API_URL": fake.api_url})
    upstream = Path(g.repo("hello", {"README.md": "hello\n"}).removeprefix("file://"))
    (root / "remotes").mkdir()
    git(root / "remotes", "clone", "-q", "--bare", str(upstream), "hello.git")
    url = fake.add_repo("octo/hello", root / "remotes" / "hello.git")
    yield g, fake, url
    g.stop()
    fake.close()


def edit_session(c: Client, url: str) -> str:
    return c.acquire_session(
        project_id="p1",
        repo_name="octo/hello",
        repo_url=url,
        base_ref="main",
        mode="edit",
        conversation_id=f"c-{uuid.uuid4().hex[:8]}",
    ).session_id


def test_a_pull_request_is_opened_read_and_commented(
    platform: tuple[Grove, FakeGitHub, str],
) -> None:
    g, fake, url = platform
    with g.client(ALICE) as c:
        ws = edit_session(c, url)
        c.tools.write_file(ws, "src/new.txt", "new\n")
        c.tools.git_commit(ws, "Add src/new.txt")
        c.tools.git_push(ws, set_upstream=True, git_token=TOKEN)
        key = f"pr-{uuid.uuid4()}"
        opened = c.create_pull_request(
            ws, title="Add new", body="From the SDK", git_token=TOKEN, idempotency_key=key
        )
        pr = opened.pull_request
        assert pr.repo == "octo/hello" and pr.state == "open" and pr.base == "main"
        assert pr.head == c.get_workspace(ws).branch_name and pr.head_sha
        again = c.create_pull_request(
            ws, title="Add new", body="From the SDK", git_token=TOKEN, idempotency_key=key
        )
        assert again.pull_request.number == pr.number and again.command_id == opened.command_id
        # The key names that command: another request under it is a conflict.
        with pytest.raises(ConflictError):
            c.create_pull_request(ws, title="Other", git_token=TOKEN, idempotency_key=key)
        assert len([r for r in fake.requests if r[0] == "POST" and r[1].endswith("/pulls")]) == 1

        read = c.get_pull_request(ws, pr.number)
        assert read.number == pr.number and read.title == "Add new" and not read.merged

        comment = c.comment_pull_request(ws, pr.number, body="LGTM", git_token=TOKEN)
        assert comment.number == pr.number and comment.repo == "octo/hello"
        assert fake.comments[-1]["body"] == "LGTM"


def test_a_wrong_platform_token_is_auth_failed(platform: tuple[Grove, FakeGitHub, str]) -> None:
    g, _, url = platform
    with g.client(ALICE) as c:
        ws = edit_session(c, url)
        c.tools.write_file(ws, "x.txt", "x\n")
        c.tools.git_commit(ws, "x")
        with pytest.raises(AuthFailedError) as e:
            c.tools.git_push(ws, set_upstream=True, git_token="ghp_wrong")
        assert e.value.status == 403 and "ghp_wrong" not in str(e.value)
        pushed = c.tools.git_push(ws, set_upstream=True, git_token=TOKEN)
        assert pushed.branch == c.get_workspace(ws).branch_name


def test_the_platforms_rate_limit_is_retried_then_raised(
    platform: tuple[Grove, FakeGitHub, str],
) -> None:
    g, fake, url = platform
    with g.client(ALICE) as c:
        ws = edit_session(c, url)
        c.tools.write_file(ws, "r.txt", "r\n")
        c.tools.git_commit(ws, "r")
        c.tools.git_push(ws, set_upstream=True, git_token=TOKEN)
        number = c.create_pull_request(ws, title="r", git_token=TOKEN).pull_request.number
        # grove answers the platform's limit as its own 429 (resource_limit); a read
        # is safe to repeat, so the client retries it.
        fake.rate_limit_next(1)
        assert c.get_pull_request(ws, number).number == number
    with g.client(ALICE, retry=RetryPolicy(max_retries=0)) as c:
        fake.rate_limit_next(1)
        with pytest.raises(ResourceLimitError) as e:
            c.get_pull_request(ws, number)
        assert e.value.status == 429 and e.value.kind == "resource_limit"
