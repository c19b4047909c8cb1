"""The bodies grove answers with, as frozen dataclasses named after the schemas of
docs/openapi.json (`Workspace` is `#/components/schemas/Workspace`).

Parsing is one generic function, `from_json`, driven by the field annotations: it
checks required fields and types, parses `date-time` strings into aware `datetime`s,
and ignores fields it does not know, so a server newer than this client still parses.
Enumerated strings (`Workspace.state`, `mode`) stay `str` in answers for the same
reason; requests take them as `Literal`s. A test checks every model's fields against
its schema's properties, so the models cannot silently fall behind the document.

The tool outputs (`TextOutput` ... `PushedOutput`) are the variants of grove's
`ToolOutput`, tagged by `output`: the document's `ToolOutput.<tool>` schemas (several
tools share one variant: `create`, `str_replace`, `insert` and `write_file` answer
`WrittenOutput`), checked field by field, nested entries included, by the contract
test.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, TypeVar, Union

from .errors import ProtocolError

Mode = Literal["analysis", "edit", "task"]
Kind = Literal["read", "write", "install", "test"]
Network = Literal["none", "limited", "default"]
Strategy = Literal["merge", "cherry_pick"]
DiffAgainst = Literal["head", "base", "ref"]
Runtime = Literal["local", "docker", "daytona", "e2b"]

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class Capabilities:
    writable: bool
    isolated: bool
    persistent: bool


@dataclass(frozen=True, kw_only=True)
class RepoCache:
    id: str
    repo_name: str
    repo_url: str
    node: str
    state: str
    last_used_at: datetime
    size_bytes: int
    created_at: datetime
    updated_at: datetime
    last_fetched_at: datetime | None = None


@dataclass(frozen=True, kw_only=True)
class EnsureRepoCacheResponse:
    command_id: str
    repo_cache: RepoCache


@dataclass(frozen=True, kw_only=True)
class Workspace:
    id: str
    repo_cache_id: str
    node: str
    user_id: str
    project_id: str
    mode: str
    base_ref: str
    base_commit: str
    local_path: str
    state: str
    dirty: bool
    last_used_at: datetime
    size_bytes: int
    capabilities: Capabilities
    created_at: datetime
    updated_at: datetime
    history_ignored: bool
    branch_name: str | None = None
    conversation_id: str | None = None
    task_id: str | None = None
    pinned_until: datetime | None = None
    evicted_at: datetime | None = None


@dataclass(frozen=True, kw_only=True)
class Session:
    """A workspace acquired for a conversation or task; `session_id` is its id."""

    session_id: str
    command_id: str
    workspace: Workspace


@dataclass(frozen=True, kw_only=True)
class WorkspaceList:
    workspaces: list[Workspace]
    next_cursor: str | None = None


@dataclass(frozen=True, kw_only=True)
class ExecResult:
    exec_id: str
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool
    truncated: bool
    duration_ms: int


@dataclass(frozen=True, kw_only=True)
class ErrorBody:
    kind: str
    message: str
    paths: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class ErrorResponse:
    error: ErrorBody


@dataclass(frozen=True, kw_only=True)
class ExecStatus:
    exec_id: str
    workspace_id: str
    status: str
    result: ExecResult | None = None
    error: ErrorBody | None = None


@dataclass(frozen=True, kw_only=True)
class ExecStarted:
    """The first event of a streamed exec."""

    exec_id: str


@dataclass(frozen=True, kw_only=True)
class ExecOutput:
    """Output of a streamed exec as it is written; `stream` is `stdout` or `stderr`."""

    stream: str
    text: str


@dataclass(frozen=True, kw_only=True)
class ExecFinished:
    """The last event of a streamed exec that ran (whatever its exit code)."""

    exec_id: str
    exit_code: int
    timed_out: bool
    truncated: bool
    duration_ms: int


ExecEvent = ExecStarted | ExecOutput | ExecFinished


@dataclass(frozen=True, kw_only=True)
class Event:
    position: int
    stream_id: str
    stream_version: int
    event_type: str
    event_version: int
    payload: dict[str, Any]
    metadata: dict[str, Any]
    recorded_at: datetime


@dataclass(frozen=True, kw_only=True)
class EventsPage:
    events: list[Event]
    next_after: int | None = None


@dataclass(frozen=True, kw_only=True)
class SessionEnd:
    exit_code: int
    killed: bool
    error: str | None = None


@dataclass(frozen=True, kw_only=True)
class InteractiveSession:
    id: str
    workspace_id: str
    runtime: str
    argv: list[str]
    max_buffer_bytes: int
    started_at: datetime
    output_bytes: int
    exit: SessionEnd | None = None


@dataclass(frozen=True, kw_only=True)
class SessionPoll:
    data: str
    offset: int
    dropped_bytes: int
    exit: SessionEnd | None = None


@dataclass(frozen=True, kw_only=True)
class ToolInfo:
    name: str
    description: str
    writes: bool
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class ToolList:
    workspace_id: str
    writable: bool
    tools: list[ToolInfo]


@dataclass(frozen=True, kw_only=True)
class BranchCommit:
    id: str
    summary: str
    author_name: str
    author_email: str
    time: int


@dataclass(frozen=True, kw_only=True)
class ChangedFile:
    path: str
    status: str
    insertions: int
    deletions: int
    binary: bool
    old_path: str | None = None


@dataclass(frozen=True, kw_only=True)
class MergeBackDiff:
    edit_workspace_id: str
    task_workspace_id: str
    edit_branch: str
    edit_head: str
    task_branch: str
    task_head: str
    commits: list[BranchCommit]
    commits_total: int
    files: list[ChangedFile]
    files_total: int
    insertions: int
    deletions: int
    fast_forward: bool
    up_to_date: bool
    task_dirty: bool
    merge_base: str | None = None


@dataclass(frozen=True, kw_only=True)
class MergeBackResult:
    edit_workspace_id: str
    task_workspace_id: str
    strategy: str
    edit_branch: str
    previous_head: str
    new_head: str
    commits: list[BranchCommit]
    created: list[str]
    skipped: list[str]
    fast_forward: bool
    up_to_date: bool
    files: list[str]


@dataclass(frozen=True, kw_only=True)
class PullRequest:
    repo: str
    number: int
    state: str
    title: str
    head: str
    base: str
    url: str
    draft: bool
    merged: bool
    head_sha: str | None = None


@dataclass(frozen=True, kw_only=True)
class PullRequestCreated:
    command_id: str
    pull_request: PullRequest


@dataclass(frozen=True, kw_only=True)
class CommentCreated:
    command_id: str
    repo: str
    number: int
    comment_id: int
    url: str


@dataclass(frozen=True, kw_only=True)
class Progress:
    """One snapshot of a clone's or fetch's progress, as git reports it."""

    phase: str
    objects_done: int
    objects_total: int
    objects_received: int
    deltas_done: int
    deltas_total: int
    bytes_received: int
    bytes_per_sec: int
    percent: int | None = None


@dataclass(frozen=True, kw_only=True)
class CommandProgress:
    """A command's ledger status and, for a clone or fetch, its last progress."""

    command_id: str
    kind: str
    status: str
    progress: Progress | None = None


# --- Tool outputs (grove_core::tools::ToolOutput, tagged by `output`) ---------------


@dataclass(frozen=True, kw_only=True)
class TextOutput:
    """`view`: numbered lines or a listing, as text for the agent."""

    text: str


@dataclass(frozen=True, kw_only=True)
class FileOutput:
    """`read_file`: the content (UTF-8, lossy) and its size in bytes."""

    path: str
    content: str
    size_bytes: int


@dataclass(frozen=True, kw_only=True)
class DirEntry:
    path: str
    kind: str
    size: int


@dataclass(frozen=True, kw_only=True)
class DirOutput:
    """`list_dir`."""

    entries: list[DirEntry]


@dataclass(frozen=True, kw_only=True)
class WrittenOutput:
    """`create`, `str_replace`, `insert`, `write_file`: what was written (no content)."""

    path: str
    size_bytes: int
    sha256: str
    created: bool


@dataclass(frozen=True, kw_only=True)
class SearchHit:
    path: str
    line: int
    text: str


@dataclass(frozen=True, kw_only=True)
class SearchOutput:
    hits: list[SearchHit]
    truncated: bool


@dataclass(frozen=True, kw_only=True)
class StatusEntry:
    path: str
    staged: str | None
    unstaged: str | None


@dataclass(frozen=True, kw_only=True)
class StatusOutput:
    entries: list[StatusEntry]
    branch: str | None
    head: str | None


@dataclass(frozen=True, kw_only=True)
class DiffOutput:
    against: str
    files: list[str]
    patch: str
    truncated: bool


@dataclass(frozen=True, kw_only=True)
class LogEntry:
    commit: str
    author_name: str
    author_email: str
    time: int
    summary: str


@dataclass(frozen=True, kw_only=True)
class LogOutput:
    entries: list[LogEntry]


@dataclass(frozen=True, kw_only=True)
class CommittedOutput:
    commit: str
    files: list[str]
    branch: str | None


@dataclass(frozen=True, kw_only=True)
class PushedOutput:
    branch: str
    commit: str
    forced: bool
    previous: str | None


@dataclass(frozen=True, kw_only=True)
class HistoryPoint:
    """One point of a workspace's history (ADR 28). `operation` is tagged by `kind`
    (`created`, `exec`, `tool`, `checkpoint`, `before_rewind`, `rewind`, `merge_back`,
    `restore`); `changes` has `added`, `modified`, `deleted`; `ignored_omitted` counts
    the ignored files a workspace acquired with `history_ignored` left out over budget."""

    number: int
    snapshot: str
    position: int | None
    at: str
    workspace_id: str
    operation: dict[str, Any]
    head: str
    branch: str | None
    changes: dict[str, int]
    ignored_omitted: int = 0


@dataclass(frozen=True, kw_only=True)
class HistoryChangedFile:
    path: str
    status: str


@dataclass(frozen=True, kw_only=True)
class HistoryOutput:
    points: list[HistoryPoint]
    total: int


@dataclass(frozen=True, kw_only=True)
class HistoryDiffOutput:
    from_point: int
    to_point: int | None
    files: list[HistoryChangedFile]
    patch: str
    truncated: bool


@dataclass(frozen=True, kw_only=True)
class PointOutput(HistoryPoint):
    """`checkpoint`: the point it recorded."""


@dataclass(frozen=True, kw_only=True)
class RewoundOutput:
    to: int
    point: HistoryPoint
    kept: int | None
    files_written: int
    files_removed: int


@dataclass(frozen=True, kw_only=True)
class ForkedOutput:
    workspace_id: str
    branch: str | None
    local_path: str
    point: int


ToolOutput = (
    TextOutput
    | FileOutput
    | DirOutput
    | WrittenOutput
    | SearchOutput
    | StatusOutput
    | DiffOutput
    | LogOutput
    | CommittedOutput
    | PushedOutput
    | HistoryOutput
    | HistoryDiffOutput
    | PointOutput
    | RewoundOutput
    | ForkedOutput
)

#: The output class of each `output` tag.
TOOL_OUTPUTS: dict[str, type[Any]] = {
    "text": TextOutput,
    "file": FileOutput,
    "dir": DirOutput,
    "written": WrittenOutput,
    "search": SearchOutput,
    "status": StatusOutput,
    "diff": DiffOutput,
    "log": LogOutput,
    "committed": CommittedOutput,
    "pushed": PushedOutput,
    "history": HistoryOutput,
    "history_diff": HistoryDiffOutput,
    "point": PointOutput,
    "rewound": RewoundOutput,
    "forked": ForkedOutput,
}


def tool_output(data: Any) -> ToolOutput:
    """A tool's answer as the class its `output` tag names."""
    if not isinstance(data, dict) or not isinstance(data.get("output"), str):
        raise ProtocolError(f"a tool output without an `output` tag: {_short(data)}")
    cls = TOOL_OUTPUTS.get(data["output"])
    if cls is None:
        raise ProtocolError(f"unknown tool output {data['output']!r}")
    out: ToolOutput = from_json(cls, data)
    return out


# --- Parsing -------------------------------------------------------------------------

_FRACTION = re.compile(r"(\.\d{6})\d+")


def parse_datetime(text: str) -> datetime:
    """An RFC 3339 time as grove writes it (chrono: up to nine fractional digits, `Z`)."""
    value = _FRACTION.sub(r"\1", text.strip())
    if value.endswith(("Z", "z")):
        value = value[:-1] + "+00:00"
    return datetime.fromisoformat(value)


_HINTS: dict[type[Any], dict[str, Any]] = {}


def _hints(cls: type[Any]) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = typing.get_type_hints(cls)
        _HINTS[cls] = hints
    return hints


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _convert(tp: Any, value: Any, where: str) -> Any:
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise ProtocolError(f"{where}: null where a value is required")
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _convert(inner[0], value, where)
        raise ProtocolError(f"{where}: unsupported union {tp}")
    if origin is list:
        if not isinstance(value, list):
            raise ProtocolError(f"{where}: expected a list, got {_short(value)}")
        (item,) = typing.get_args(tp)
        return [_convert(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ProtocolError(f"{where}: expected an object, got {_short(value)}")
        _, item = typing.get_args(tp)
        return {k: _convert(item, v, f"{where}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return from_json(tp, value, where)
    if tp is datetime:
        if not isinstance(value, str):
            raise ProtocolError(f"{where}: expected a date-time, got {_short(value)}")
        try:
            return parse_datetime(value)
        except ValueError as e:
            raise ProtocolError(f"{where}: not an RFC 3339 time: {value!r}") from e
    if tp is bool:
        if not isinstance(value, bool):
            raise ProtocolError(f"{where}: expected a boolean, got {_short(value)}")
        return value
    if tp is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise ProtocolError(f"{where}: expected an integer, got {_short(value)}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ProtocolError(f"{where}: expected a string, got {_short(value)}")
        return value
    raise ProtocolError(f"{where}: unsupported type {tp}")


def from_json(cls: type[T], data: Any, where: str | None = None) -> T:
    """`data` (parsed JSON) as an instance of the dataclass `cls`.

    Unknown fields are ignored; a missing required field, a null where none is allowed
    or a value of the wrong type is a `ProtocolError` naming the field.
    """
    where = where or cls.__name__
    if not isinstance(data, dict):
        raise ProtocolError(f"{where}: expected an object, got {_short(data)}")
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in data:
            kwargs[f.name] = _convert(hints[f.name], data[f.name], f"{where}.{f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ProtocolError(f"{where}: missing required field {f.name!r}")
    return cls(**kwargs)


#: Every model named after a schema of docs/openapi.json, by that name.
SCHEMA_MODELS: dict[str, type[Any]] = {
    cls.__name__: cls
    for cls in (
        Capabilities,
        RepoCache,
        EnsureRepoCacheResponse,
        Workspace,
        Session,
        WorkspaceList,
        ExecResult,
        ErrorBody,
        ErrorResponse,
        ExecStatus,
        ExecStarted,
        ExecOutput,
        ExecFinished,
        Event,
        EventsPage,
        SessionEnd,
        InteractiveSession,
        SessionPoll,
        ToolInfo,
        ToolList,
        BranchCommit,
        ChangedFile,
        MergeBackDiff,
        MergeBackResult,
        PullRequest,
        PullRequestCreated,
        CommentCreated,
        Progress,
        CommandProgress,
    )
}
