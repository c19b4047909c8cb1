"""Every operation of grove's HTTP API as a function from its arguments to an `Op`.

The clients' methods are one line over these. `ROUTES` names, for each operation of
docs/openapi.json (method and path template), the client methods that call it; the
contract test fails when the document has an operation missing here, or the other way
round.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from . import models as m
from ._core import (
    DEFAULT,
    STREAM_READ_TIMEOUT,
    Op,
    Secret,
    body_json,
    compact,
    parse_none,
    parse_tool,
    parser,
    query,
    segment,
)
from .errors import ProtocolError

#: (method, path template of docs/openapi.json) -> the client methods that call it.
#: Names with a dot are on `client.tools`.
ROUTES: dict[tuple[str, str], tuple[str, ...]] = {
    ("POST", "/v1/repo-caches/ensure"): ("ensure_repo_cache",),
    ("POST", "/v1/sessions"): ("acquire_session",),
    ("POST", "/v1/sessions/{id}/release"): ("release_session",),
    ("GET", "/v1/workspaces"): ("list_workspaces", "iter_workspaces"),
    ("GET", "/v1/workspaces/{id}"): ("get_workspace",),
    ("DELETE", "/v1/workspaces/{id}"): ("destroy_workspace",),
    ("POST", "/v1/workspaces/{id}/pin"): ("pin_workspace",),
    ("POST", "/v1/workspaces/{id}/restore"): ("restore_workspace",),
    ("POST", "/v1/workspaces/{id}/exec"): ("exec",),
    ("POST", "/v1/workspaces/{id}/exec/stream"): ("exec_stream",),
    ("GET", "/v1/execs/{id}"): ("get_exec",),
    ("GET", "/v1/workspaces/{id}/events"): ("events", "iter_events", "follow_events"),
    ("GET", "/v1/workspaces/{id}/merge-back/{task_id}"): ("merge_back_diff",),
    ("POST", "/v1/workspaces/{id}/merge-back"): ("merge_back",),
    ("POST", "/v1/workspaces/{id}/sessions/interactive"): ("start_interactive",),
    ("GET", "/v1/workspaces/{id}/sessions/interactive"): ("list_interactive",),
    ("POST", "/v1/workspaces/{id}/sessions/interactive/{session_id}/write"): ("write_interactive",),
    ("POST", "/v1/workspaces/{id}/sessions/interactive/{session_id}/poll"): ("poll_interactive",),
    ("POST", "/v1/workspaces/{id}/sessions/interactive/{session_id}/kill"): ("kill_interactive",),
    ("GET", "/v1/workspaces/{id}/tools"): ("list_tools",),
    ("POST", "/v1/workspaces/{id}/tools/{tool}"): ("call_tool",),
    ("POST", "/v1/workspaces/{id}/pulls"): ("create_pull_request",),
    ("GET", "/v1/workspaces/{id}/pulls/{number}"): ("get_pull_request",),
    ("POST", "/v1/workspaces/{id}/pulls/{number}/comments"): ("comment_pull_request",),
    ("POST", "/v1/workspaces/{id}/mcp"): ("mcp",),
    ("GET", "/v1/progress"): ("get_progress",),
}

#: Routes the SDK serves before docs/openapi.json has them, each with where it comes
#: from. The contract test accepts these (printing them) while the document lacks
#: them, and checks them like any other once it has them; the server tests of such a
#: route skip, saying why, until the server under test serves it.
UPCOMING: dict[tuple[str, str], str] = {
    ("GET", "/v1/progress"): "clone progress (branch git-clone, ADR 25)",
}

#: The agent tools: name -> (its `ToolArgs.<name>` is the method's keywords, whether
#: repeating it is harmless, the output class).
TOOLS: dict[str, tuple[bool, type[Any]]] = {
    "view": (True, m.TextOutput),
    "create": (False, m.WrittenOutput),
    "str_replace": (False, m.WrittenOutput),
    "insert": (False, m.WrittenOutput),
    "read_file": (True, m.FileOutput),
    "write_file": (True, m.WrittenOutput),
    "list_dir": (True, m.DirOutput),
    "search": (True, m.SearchOutput),
    "git_status": (True, m.StatusOutput),
    "git_diff": (True, m.DiffOutput),
    "git_log": (True, m.LogOutput),
    "git_commit": (False, m.CommittedOutput),
    "git_push": (False, m.PushedOutput),
    "history": (True, m.HistoryOutput),
    "history_diff": (True, m.HistoryDiffOutput),
    "history_file": (True, m.FileOutput),
    "checkpoint": (False, m.PointOutput),
    "rewind": (False, m.RewoundOutput),
    "undo": (False, m.RewoundOutput),
    "fork": (False, m.ForkedOutput),
}
for _tool in TOOLS:
    ROUTES[("POST", f"/v1/workspaces/{{id}}/tools/{_tool}")] = (f"tools.{_tool}",)


def _secret(token: str | Secret | None) -> Secret | None:
    if token is None or isinstance(token, Secret):
        return token
    return Secret(token)


def _ws(workspace_id: str) -> str:
    return f"/v1/workspaces/{segment(workspace_id)}"


def ensure_repo_cache(
    *,
    repo_name: str,
    repo_url: str,
    ref: str | None,
    fetch: bool | None,
    idempotency_key: str | None,
    git_token: str | Secret | None,
) -> Op[m.EnsureRepoCacheResponse]:
    return Op(
        "POST",
        "/v1/repo-caches/ensure",
        parser(m.EnsureRepoCacheResponse),
        body=compact(
            {
                "repo_name": repo_name,
                "repo_url": repo_url,
                "ref": ref,
                "fetch": fetch,
                "idempotency_key": idempotency_key,
            }
        ),
        git_token=_secret(git_token),
        repeatable=True,
        has_body=True,
        read_timeout=None,
        route=("POST", "/v1/repo-caches/ensure"),
    )


def acquire_session(
    *,
    project_id: str,
    repo_name: str,
    repo_url: str,
    base_ref: str,
    mode: m.Mode,
    conversation_id: str | None,
    task_id: str | None,
    runtime: str | None,
    history_ignored: bool,
    idempotency_key: str | None,
    git_token: str | Secret | None,
) -> Op[m.Session]:
    # The uniqueness key (user, project, conversation or task) makes acquiring twice
    # return the same workspace, so a repeat is harmless.
    return Op(
        "POST",
        "/v1/sessions",
        parser(m.Session),
        body=compact(
            {
                "project_id": project_id,
                "repo_name": repo_name,
                "repo_url": repo_url,
                "base_ref": base_ref,
                "mode": mode,
                "conversation_id": conversation_id,
                "task_id": task_id,
                "runtime": runtime,
                "history_ignored": history_ignored or None,
                "idempotency_key": idempotency_key,
            }
        ),
        git_token=_secret(git_token),
        repeatable=True,
        has_body=True,
        read_timeout=None,
        route=("POST", "/v1/sessions"),
    )


def release_session(session_id: str, *, destroy_runtime: bool | None) -> Op[None]:
    return Op(
        "POST",
        f"/v1/sessions/{segment(session_id)}/release",
        parse_none,
        body=compact({"destroy_runtime": destroy_runtime}),
        repeatable=True,
        has_body=True,
        read_timeout=None,
        route=("POST", "/v1/sessions/{id}/release"),
    )


def list_workspaces(
    *, user: str | None, limit: int | None, cursor: str | None
) -> Op[m.WorkspaceList]:
    return Op(
        "GET",
        "/v1/workspaces",
        parser(m.WorkspaceList),
        params=query({"user": user, "limit": limit, "cursor": cursor}),
        repeatable=True,
        route=("GET", "/v1/workspaces"),
    )


def get_workspace(workspace_id: str) -> Op[m.Workspace]:
    return Op(
        "GET",
        _ws(workspace_id),
        parser(m.Workspace),
        repeatable=True,
        route=("GET", "/v1/workspaces/{id}"),
    )


def destroy_workspace(workspace_id: str) -> Op[None]:
    return Op(
        "DELETE",
        _ws(workspace_id),
        parse_none,
        repeatable=True,
        read_timeout=None,
        route=("DELETE", "/v1/workspaces/{id}"),
    )


def pin_workspace(workspace_id: str, *, until: datetime | None) -> Op[m.Workspace]:
    if until is not None and until.tzinfo is None:
        raise ValueError("`until` must be an aware datetime (with a time zone)")
    return Op(
        "POST",
        f"{_ws(workspace_id)}/pin",
        parser(m.Workspace),
        body={"until": until.isoformat() if until is not None else None},
        repeatable=True,
        has_body=True,
        read_timeout=None,
        route=("POST", "/v1/workspaces/{id}/pin"),
    )


def restore_workspace(workspace_id: str, *, git_token: str | Secret | None) -> Op[m.Workspace]:
    return Op(
        "POST",
        f"{_ws(workspace_id)}/restore",
        parser(m.Workspace),
        git_token=_secret(git_token),
        repeatable=True,
        read_timeout=None,
        route=("POST", "/v1/workspaces/{id}/restore"),
    )


def exec_body(
    argv: Sequence[str],
    *,
    cwd: str | None,
    env: Mapping[str, str] | None,
    stdin: str | None,
    kind: m.Kind | None,
    network: m.Network | None,
    runtime: str | None,
    timeout_ms: int | None,
    max_output_bytes: int | None,
    idempotency_key: str | None,
    keep_output: bool | None = None,
) -> dict[str, Any]:
    if isinstance(argv, str):
        raise TypeError("argv is a list of arguments, not a string (no shell is implied)")
    return compact(
        {
            "argv": list(argv),
            "cwd": cwd,
            "env": dict(env) if env is not None else None,
            "stdin": stdin,
            "kind": kind,
            "network": network,
            "runtime": runtime,
            "timeout_ms": timeout_ms,
            "max_output_bytes": max_output_bytes,
            "idempotency_key": idempotency_key,
            "keep_output": keep_output,
        }
    )


def exec_(workspace_id: str, body: dict[str, Any]) -> Op[m.ExecResult]:
    # An exec runs at most once per command id: only a keyed one may be sent again.
    return Op(
        "POST",
        f"{_ws(workspace_id)}/exec",
        parser(m.ExecResult),
        body=body,
        repeatable="idempotency_key" in body,
        has_body=True,
        read_timeout=None,
        route=("POST", "/v1/workspaces/{id}/exec"),
    )


def exec_stream(workspace_id: str, body: dict[str, Any]) -> Op[None]:
    return Op(
        "POST",
        f"{_ws(workspace_id)}/exec/stream",
        parse_none,
        body=body,
        repeatable="idempotency_key" in body,
        has_body=True,
        read_timeout=STREAM_READ_TIMEOUT,
        route=("POST", "/v1/workspaces/{id}/exec/stream"),
    )


def get_exec(exec_id: str) -> Op[m.ExecStatus]:
    return Op(
        "GET",
        f"/v1/execs/{segment(exec_id)}",
        parser(m.ExecStatus),
        repeatable=True,
        route=("GET", "/v1/execs/{id}"),
    )


def events(
    workspace_id: str, *, after: int | None, limit: int | None, follow: bool = False
) -> Op[m.EventsPage]:
    return Op(
        "GET",
        f"{_ws(workspace_id)}/events",
        parser(m.EventsPage),
        params=query({"after": after, "limit": limit, "follow": True if follow else None}),
        repeatable=True,
        read_timeout=STREAM_READ_TIMEOUT if follow else DEFAULT,
        route=("GET", "/v1/workspaces/{id}/events"),
    )


def merge_back_diff(workspace_id: str, task_workspace_id: str) -> Op[m.MergeBackDiff]:
    return Op(
        "GET",
        f"{_ws(workspace_id)}/merge-back/{segment(task_workspace_id)}",
        parser(m.MergeBackDiff),
        repeatable=True,
        read_timeout=None,
        route=("GET", "/v1/workspaces/{id}/merge-back/{task_id}"),
    )


def merge_back(
    workspace_id: str,
    *,
    task_workspace_id: str,
    strategy: m.Strategy,
    idempotency_key: str | None,
) -> Op[m.MergeBackResult]:
    return Op(
        "POST",
        f"{_ws(workspace_id)}/merge-back",
        parser(m.MergeBackResult),
        body=compact(
            {
                "task_workspace_id": task_workspace_id,
                "strategy": strategy,
                "idempotency_key": idempotency_key,
            }
        ),
        repeatable=idempotency_key is not None,
        has_body=True,
        read_timeout=None,
        route=("POST", "/v1/workspaces/{id}/merge-back"),
    )


def start_interactive(
    workspace_id: str,
    argv: Sequence[str],
    *,
    cwd: str | None,
    env: Mapping[str, str] | None,
    max_buffer_bytes: int | None,
) -> Op[m.InteractiveSession]:
    if isinstance(argv, str):
        raise TypeError("argv is a list of arguments, not a string")
    return Op(
        "POST",
        f"{_ws(workspace_id)}/sessions/interactive",
        parser(m.InteractiveSession),
        body=compact(
            {
                "argv": list(argv),
                "cwd": cwd,
                "env": dict(env) if env is not None else None,
                "max_buffer_bytes": max_buffer_bytes,
            }
        ),
        has_body=True,
        route=("POST", "/v1/workspaces/{id}/sessions/interactive"),
    )


def list_interactive(workspace_id: str) -> Op[list[m.InteractiveSession]]:
    def parse(response: Any) -> list[m.InteractiveSession]:
        data = body_json(response)
        if not isinstance(data, list):
            raise ProtocolError("expected a list of interactive sessions")
        return [m.from_json(m.InteractiveSession, d) for d in data]

    return Op(
        "GET",
        f"{_ws(workspace_id)}/sessions/interactive",
        parse,
        repeatable=True,
        route=("GET", "/v1/workspaces/{id}/sessions/interactive"),
    )


def _interactive(workspace_id: str, session_id: str) -> str:
    return f"{_ws(workspace_id)}/sessions/interactive/{segment(session_id)}"


def write_interactive(
    workspace_id: str, session_id: str, *, data: str | None, close: bool | None
) -> Op[None]:
    return Op(
        "POST",
        f"{_interactive(workspace_id, session_id)}/write",
        parse_none,
        body=compact({"data": data, "close": close}),
        has_body=True,
        route=("POST", "/v1/workspaces/{id}/sessions/interactive/{session_id}/write"),
    )


def poll_interactive(
    workspace_id: str, session_id: str, *, wait_ms: int | None
) -> Op[m.SessionPoll]:
    # Not repeatable: a poll hands over the output since the previous one.
    return Op(
        "POST",
        f"{_interactive(workspace_id, session_id)}/poll",
        parser(m.SessionPoll),
        body=compact({"wait_ms": wait_ms}),
        has_body=True,
        route=("POST", "/v1/workspaces/{id}/sessions/interactive/{session_id}/poll"),
    )


def kill_interactive(workspace_id: str, session_id: str) -> Op[None]:
    return Op(
        "POST",
        f"{_interactive(workspace_id, session_id)}/kill",
        parse_none,
        repeatable=True,
        route=("POST", "/v1/workspaces/{id}/sessions/interactive/{session_id}/kill"),
    )


def list_tools(workspace_id: str) -> Op[m.ToolList]:
    return Op(
        "GET",
        f"{_ws(workspace_id)}/tools",
        parser(m.ToolList),
        repeatable=True,
        route=("GET", "/v1/workspaces/{id}/tools"),
    )


def call_tool(
    workspace_id: str,
    tool: str,
    args: Mapping[str, Any] | None,
    *,
    git_token: str | Secret | None = None,
    idempotency_key: str | None = None,
) -> Op[m.ToolOutput]:
    repeatable, _ = TOOLS.get(tool, (False, None))

    def parse(response: Any) -> m.ToolOutput:
        return m.tool_output(body_json(response))

    return Op(
        "POST",
        f"{_ws(workspace_id)}/tools/{segment(tool)}",
        parse,
        body=dict(args or {}),
        git_token=_secret(git_token),
        idempotency_key=idempotency_key,
        # With a key, a retry is the same command: answered, never run twice.
        repeatable=repeatable or idempotency_key is not None,
        has_body=True,
        read_timeout=None,
        route=("POST", "/v1/workspaces/{id}/tools/{tool}"),
    )


def tool(
    workspace_id: str,
    name: str,
    args: Mapping[str, Any],
    *,
    git_token: str | Secret | None = None,
) -> Op[Any]:
    """A typed tool call: `args` are the method's keywords (None left out)."""
    repeatable, out = TOOLS[name]
    return Op(
        "POST",
        f"{_ws(workspace_id)}/tools/{name}",
        parse_tool(out),
        body=compact(args),
        git_token=_secret(git_token),
        repeatable=repeatable,
        has_body=True,
        read_timeout=None,
        route=("POST", f"/v1/workspaces/{{id}}/tools/{name}"),
    )


def create_pull_request(
    workspace_id: str,
    *,
    title: str,
    body: str | None,
    base: str | None,
    draft: bool | None,
    idempotency_key: str | None,
    git_token: str | Secret,
) -> Op[m.PullRequestCreated]:
    return Op(
        "POST",
        f"{_ws(workspace_id)}/pulls",
        parser(m.PullRequestCreated),
        body=compact(
            {
                "title": title,
                "body": body,
                "base": base,
                "draft": draft,
                "idempotency_key": idempotency_key,
            }
        ),
        git_token=_secret(git_token),
        repeatable=idempotency_key is not None,
        has_body=True,
        read_timeout=None,
        route=("POST", "/v1/workspaces/{id}/pulls"),
    )


def get_pull_request(
    workspace_id: str, number: int, *, git_token: str | Secret | None
) -> Op[m.PullRequest]:
    return Op(
        "GET",
        f"{_ws(workspace_id)}/pulls/{segment(number)}",
        parser(m.PullRequest),
        git_token=_secret(git_token),
        repeatable=True,
        route=("GET", "/v1/workspaces/{id}/pulls/{number}"),
    )


def comment_pull_request(
    workspace_id: str,
    number: int,
    *,
    body: str,
    idempotency_key: str | None,
    git_token: str | Secret,
) -> Op[m.CommentCreated]:
    return Op(
        "POST",
        f"{_ws(workspace_id)}/pulls/{segment(number)}/comments",
        parser(m.CommentCreated),
        body=compact({"body": body, "idempotency_key": idempotency_key}),
        git_token=_secret(git_token),
        repeatable=idempotency_key is not None,
        has_body=True,
        read_timeout=None,
        route=("POST", "/v1/workspaces/{id}/pulls/{number}/comments"),
    )


#: MCP methods that change nothing, so a retry after grove's own 429/503 is harmless.
MCP_READS = frozenset({"initialize", "ping", "tools/list"})


def mcp(
    workspace_id: str,
    message: Mapping[str, Any],
    *,
    runtime: str | None,
    git_token: str | Secret | None,
) -> Op[dict[str, Any] | None]:
    def parse(response: Any) -> dict[str, Any] | None:
        if response.status_code == 202:
            return None
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            raise ProtocolError("an MCP answer as an event stream: use an MCP client")
        data = body_json(response)
        if not isinstance(data, dict):
            raise ProtocolError("an MCP answer that is not one JSON-RPC object")
        return data

    return Op(
        "POST",
        f"{_ws(workspace_id)}/mcp",
        parse,
        body=dict(message),
        params=query({"runtime": runtime}),
        git_token=_secret(git_token),
        repeatable=message.get("method") in MCP_READS,
        has_body=True,
        read_timeout=None,
        route=("POST", "/v1/workspaces/{id}/mcp"),
        accept="application/json, text/event-stream",
    )


def get_progress(idempotency_key: str) -> Op[m.CommandProgress]:
    return Op(
        "GET",
        "/v1/progress",
        parser(m.CommandProgress),
        params=query({"idempotency_key": idempotency_key}),
        repeatable=True,
        route=("GET", "/v1/progress"),
    )
