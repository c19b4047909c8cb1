"""The synchronous client: `Client`, its tools (`client.tools`) and its streams.

Methods build an `Op` (`_ops`) and send it through `Client._request`, which owns the
retry loop; everything else (request bodies, parsing, errors, the retry rule, SSE) is
in `_core` and shared with the async client in `aio.py`, whose methods mirror these one
for one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar

import httpx

from . import _ops
from . import models as m
from ._core import (
    USER_AGENT,
    BearerAuth,
    Op,
    RetryPolicy,
    Secret,
    SseDecoder,
    build_request,
    error_from,
    exec_event,
    from_environment,
    retry_delay,
    stream_event,
)
from .errors import ProtocolError, TransportError

T = TypeVar("T")
log = logging.getLogger("grove_client")

DEFAULT_TIMEOUT = httpx.Timeout(30.0, read=120.0)


class Client:
    """A grove server at `base_url`, called with the bearer `token`.

    ```python
    with Client("http://127.0.0.1:8080", token=os.environ["GROVE_TOKEN"]) as grove:
        s = grove.acquire_session(project_id="p", repo_name="o/r", repo_url=url,
                                  base_ref="main", mode="edit", conversation_id="c1")
        print(grove.exec(s.session_id, ["git", "status"]).stdout)
    ```

    The token is held as a `Secret`: it appears in no repr, log line or exception.
    `retry` says how 429 and 503 answers are retried (see `RetryPolicy`).
    """

    def __init__(
        self,
        base_url: str,
        token: str | Secret,
        *,
        timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._token = token if isinstance(token, Secret) else Secret(token)
        self._retry = retry if retry is not None else RetryPolicy()
        self._timeout = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)
        self._http = httpx.Client(
            base_url=base_url,
            auth=BearerAuth(self._token),
            timeout=self._timeout,
            headers={"User-Agent": USER_AGENT, "Accept": "application/json"},
            transport=transport,
            follow_redirects=False,
        )
        self.base_url = str(self._http.base_url)
        self.tools = Tools(self)

    @classmethod
    def from_env(
        cls,
        *,
        timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
    ) -> Client:
        """A client of the server in `GROVE_URL` with the token in `GROVE_TOKEN` (the
        variables the CLI reads for its calls over HTTP)."""
        url, token = from_environment()
        return cls(url, token, timeout=timeout, retry=retry)

    def __repr__(self) -> str:
        return f"Client({self.base_url!r}, token=Secret('***'))"

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- transport -------------------------------------------------------------------

    def _request(self, op: Op[Any], *, stream: bool = False) -> httpx.Response:
        """Sends `op`, retrying as the policy and `op.repeatable` allow; returns a
        successful answer (still open when `stream`) or raises."""
        attempt = 0
        while True:
            request = build_request(self._http, op, self._timeout)
            try:
                response = self._http.send(request, stream=stream)
            except httpx.ConnectError as e:
                # Nothing reached the server: safe to send again, whatever the op.
                if attempt < self._retry.max_retries:
                    pause = self._retry.backoff * float(2**attempt)
                    log.info("%s: cannot connect, retrying in %.1f s", op.describe(), pause)
                    time.sleep(pause)
                    attempt += 1
                    continue
                raise TransportError(f"{op.describe()}: cannot connect: {e}") from None
            except httpx.TimeoutException as e:
                raise TransportError(f"{op.describe()}: timed out ({type(e).__name__})") from None
            except httpx.TransportError as e:
                raise TransportError(f"{op.describe()}: {type(e).__name__}: {e}") from None
            log.debug(
                "%s: %d",
                op.describe(),
                response.status_code,
                extra={"grove_route": op.route},
            )
            if response.is_success:
                return response
            if stream:
                response.read()
                response.close()
            delay = retry_delay(self._retry, attempt, response, op)
            if delay is None:
                raise error_from(response, op)
            log.info(
                "%s: answered %d, retrying in %.1f s", op.describe(), response.status_code, delay
            )
            time.sleep(delay)
            attempt += 1

    def _send(self, op: Op[T]) -> T:
        return op.parse(self._request(op))

    # --- repo caches and sessions ----------------------------------------------------

    def ensure_repo_cache(
        self,
        *,
        repo_name: str,
        repo_url: str,
        ref: str | None = None,
        fetch: bool | None = None,
        idempotency_key: str | None = None,
        git_token: str | Secret | None = None,
    ) -> m.EnsureRepoCacheResponse:
        """Clone `repo_url` once into a repo cache (or fetch / touch the existing one)."""
        return self._send(
            _ops.ensure_repo_cache(
                repo_name=repo_name,
                repo_url=repo_url,
                ref=ref,
                fetch=fetch,
                idempotency_key=idempotency_key,
                git_token=git_token,
            )
        )

    def acquire_session(
        self,
        *,
        project_id: str,
        repo_name: str,
        repo_url: str,
        base_ref: str,
        mode: m.Mode,
        conversation_id: str | None = None,
        task_id: str | None = None,
        runtime: str | None = None,
        history_ignored: bool = False,
        idempotency_key: str | None = None,
        git_token: str | Secret | None = None,
    ) -> m.Session:
        """The caller's workspace for (project, conversation or task), made if new.

        `history_ignored`: a new workspace's history points keep ignored files too, up
        to the server's budget per point."""
        return self._send(
            _ops.acquire_session(
                project_id=project_id,
                repo_name=repo_name,
                repo_url=repo_url,
                base_ref=base_ref,
                mode=mode,
                conversation_id=conversation_id,
                task_id=task_id,
                runtime=runtime,
                history_ignored=history_ignored,
                idempotency_key=idempotency_key,
                git_token=git_token,
            )
        )

    def release_session(self, session_id: str, *, destroy_runtime: bool | None = None) -> None:
        """Stop (or destroy) the session's runtime; the workspace's files stay."""
        self._send(_ops.release_session(session_id, destroy_runtime=destroy_runtime))

    # --- workspaces ------------------------------------------------------------------

    def list_workspaces(
        self, *, user: str | None = None, limit: int | None = None, cursor: str | None = None
    ) -> m.WorkspaceList:
        """One page of the caller's workspaces (operators: anyone's, or `user`'s)."""
        return self._send(_ops.list_workspaces(user=user, limit=limit, cursor=cursor))

    def iter_workspaces(
        self, *, user: str | None = None, page_size: int | None = None
    ) -> Iterator[m.Workspace]:
        """Every workspace, page after page (`next_cursor`)."""
        cursor: str | None = None
        while True:
            page = self.list_workspaces(user=user, limit=page_size, cursor=cursor)
            yield from page.workspaces
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def get_workspace(self, workspace_id: str) -> m.Workspace:
        return self._send(_ops.get_workspace(workspace_id))

    def destroy_workspace(self, workspace_id: str) -> None:
        """Remove the workspace, its runtimes and its files."""
        self._send(_ops.destroy_workspace(workspace_id))

    def pin_workspace(self, workspace_id: str, *, until: datetime | None) -> m.Workspace:
        """Keep the workspace from eviction until `until` (None unpins)."""
        return self._send(_ops.pin_workspace(workspace_id, until=until))

    def restore_workspace(
        self, workspace_id: str, *, git_token: str | Secret | None = None
    ) -> m.Workspace:
        """Bring an evicted workspace back: same id, path, branch and saved work."""
        return self._send(_ops.restore_workspace(workspace_id, git_token=git_token))

    # --- exec ------------------------------------------------------------------------

    def exec(
        self,
        workspace_id: str,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | None = None,
        kind: m.Kind | None = None,
        network: m.Network | None = None,
        runtime: str | None = None,
        timeout_ms: int | None = None,
        max_output_bytes: int | None = None,
        idempotency_key: str | None = None,
        keep_output: bool | None = None,
    ) -> m.ExecResult:
        """Run `argv` (no shell) in the workspace and return its collected result.

        A non-zero exit is a result, not an exception. With `idempotency_key`, sending
        it again (by you or by the retry rule) runs it once and answers its result.
        """
        body = _ops.exec_body(
            argv,
            cwd=cwd,
            env=env,
            stdin=stdin,
            kind=kind,
            network=network,
            runtime=runtime,
            timeout_ms=timeout_ms,
            max_output_bytes=max_output_bytes,
            idempotency_key=idempotency_key,
            keep_output=keep_output,
        )
        return self._send(_ops.exec_(workspace_id, body))

    def exec_stream(
        self,
        workspace_id: str,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | None = None,
        kind: m.Kind | None = None,
        network: m.Network | None = None,
        runtime: str | None = None,
        timeout_ms: int | None = None,
        max_output_bytes: int | None = None,
        idempotency_key: str | None = None,
        keep_output: bool | None = None,
    ) -> ExecStream:
        """Run `argv` and iterate over its output while it runs.

        ```python
        with grove.exec_stream(ws, ["make", "test"]) as run:
            for event in run:
                if isinstance(event, ExecOutput):
                    print(event.text, end="")
        print(run.finished.exit_code)
        ```

        Iteration yields `ExecStarted`, then `ExecOutput` chunks as the command writes,
        then `ExecFinished`; a failure (refused, worker lost) is raised as its error
        class. Leaving early closes the stream; the command still runs to completion
        (`get_exec` has its result).
        """
        body = _ops.exec_body(
            argv,
            cwd=cwd,
            env=env,
            stdin=stdin,
            kind=kind,
            network=network,
            runtime=runtime,
            timeout_ms=timeout_ms,
            max_output_bytes=max_output_bytes,
            idempotency_key=idempotency_key,
            keep_output=keep_output,
        )
        op = _ops.exec_stream(workspace_id, body)
        return ExecStream(op, self._request(op, stream=True))

    def get_exec(self, exec_id: str) -> m.ExecStatus:
        """An exec as the ledger has it: queued, running, or its result or error."""
        return self._send(_ops.get_exec(exec_id))

    def get_progress(self, idempotency_key: str) -> m.CommandProgress:
        """The status of the caller's command submitted with `idempotency_key` and, for
        a clone or fetch (`ensure_repo_cache`, `acquire_session`), its last progress
        snapshot: poll it from another thread or task while the call runs."""
        return self._send(_ops.get_progress(idempotency_key))

    # --- events ----------------------------------------------------------------------

    def events(
        self, workspace_id: str, *, after: int | None = None, limit: int | None = None
    ) -> m.EventsPage:
        """One page of the workspace's events after position `after`."""
        return self._send(_ops.events(workspace_id, after=after, limit=limit))

    def iter_events(
        self, workspace_id: str, *, after: int | None = None, page_size: int | None = None
    ) -> Iterator[m.Event]:
        """Every event recorded so far, page after page; stops at the end of the log."""
        while True:
            page = self.events(workspace_id, after=after, limit=page_size)
            yield from page.events
            if not page.events:
                return
            after = page.next_after if page.next_after is not None else page.events[-1].position

    def follow_events(self, workspace_id: str, *, after: int | None = None) -> EventStream:
        """The workspace's events now and as they are appended (server-sent events),
        until closed. A dropped connection is resumed after the last position seen,
        up to the retry policy's `max_retries` times in a row."""
        return EventStream(self, workspace_id, after)

    # --- merge-back ------------------------------------------------------------------

    def merge_back_diff(self, workspace_id: str, task_workspace_id: str) -> m.MergeBackDiff:
        """What merging the task workspace's commits into this edit workspace brings."""
        return self._send(_ops.merge_back_diff(workspace_id, task_workspace_id))

    def merge_back(
        self,
        workspace_id: str,
        *,
        task_workspace_id: str,
        strategy: m.Strategy = "merge",
        idempotency_key: str | None = None,
    ) -> m.MergeBackResult:
        """Bring the task's commits onto the edit branch; a conflict raises
        `ConflictError` with every conflicting path in `paths`, nothing changed."""
        return self._send(
            _ops.merge_back(
                workspace_id,
                task_workspace_id=task_workspace_id,
                strategy=strategy,
                idempotency_key=idempotency_key,
            )
        )

    # --- interactive sessions --------------------------------------------------------

    def start_interactive(
        self,
        workspace_id: str,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        max_buffer_bytes: int | None = None,
    ) -> m.InteractiveSession:
        """Start a long-lived process (a shell, a REPL) in the workspace's runtime."""
        return self._send(
            _ops.start_interactive(
                workspace_id, argv, cwd=cwd, env=env, max_buffer_bytes=max_buffer_bytes
            )
        )

    def list_interactive(self, workspace_id: str) -> list[m.InteractiveSession]:
        return self._send(_ops.list_interactive(workspace_id))

    def write_interactive(
        self,
        workspace_id: str,
        session_id: str,
        data: str | None = None,
        *,
        close: bool | None = None,
    ) -> None:
        """Write to the session's stdin (`close` closes it after `data`)."""
        self._send(_ops.write_interactive(workspace_id, session_id, data=data, close=close))

    def poll_interactive(
        self, workspace_id: str, session_id: str, *, wait_ms: int | None = None
    ) -> m.SessionPoll:
        """Output since the previous poll, waiting up to `wait_ms` for some."""
        return self._send(_ops.poll_interactive(workspace_id, session_id, wait_ms=wait_ms))

    def kill_interactive(self, workspace_id: str, session_id: str) -> None:
        self._send(_ops.kill_interactive(workspace_id, session_id))

    # --- tools -----------------------------------------------------------------------

    def list_tools(self, workspace_id: str) -> m.ToolList:
        """The tools the workspace offers, each with the JSON Schema of its arguments."""
        return self._send(_ops.list_tools(workspace_id))

    def call_tool(
        self,
        workspace_id: str,
        tool: str,
        args: Mapping[str, Any] | None = None,
        *,
        git_token: str | Secret | None = None,
        idempotency_key: str | None = None,
    ) -> m.ToolOutput:
        """Any tool by name with untyped arguments (what an agent loop relays); the
        typed methods are on `client.tools`. With `idempotency_key`, a retry of the
        same call answers the first call's outcome and never runs the tool twice."""
        return self._send(
            _ops.call_tool(
                workspace_id, tool, args, git_token=git_token, idempotency_key=idempotency_key
            )
        )

    def mcp(
        self,
        workspace_id: str,
        message: Mapping[str, Any],
        *,
        runtime: str | None = None,
        git_token: str | Secret | None = None,
    ) -> dict[str, Any] | None:
        """Send one JSON-RPC message of the Model Context Protocol to the workspace's
        MCP endpoint and return its JSON-RPC response (None for a notification).

        For an agent, point an MCP client (the official `mcp` SDK's streamable HTTP
        client) at `{base_url}v1/workspaces/{id}/mcp` with this client's bearer
        token; this method is the plain request, for scripts and checks. An MCP error
        is a response with `error`, a failing tool a result with `isError`: neither
        is raised.
        """
        return self._send(_ops.mcp(workspace_id, message, runtime=runtime, git_token=git_token))

    # --- pull requests ---------------------------------------------------------------

    def create_pull_request(
        self,
        workspace_id: str,
        *,
        title: str,
        git_token: str | Secret,
        body: str | None = None,
        base: str | None = None,
        draft: bool | None = None,
        idempotency_key: str | None = None,
    ) -> m.PullRequestCreated:
        """Push the workspace's branch and open a pull request from it."""
        return self._send(
            _ops.create_pull_request(
                workspace_id,
                title=title,
                body=body,
                base=base,
                draft=draft,
                idempotency_key=idempotency_key,
                git_token=git_token,
            )
        )

    def get_pull_request(
        self, workspace_id: str, number: int, *, git_token: str | Secret | None = None
    ) -> m.PullRequest:
        return self._send(_ops.get_pull_request(workspace_id, number, git_token=git_token))

    def comment_pull_request(
        self,
        workspace_id: str,
        number: int,
        *,
        body: str,
        git_token: str | Secret,
        idempotency_key: str | None = None,
    ) -> m.CommentCreated:
        return self._send(
            _ops.comment_pull_request(
                workspace_id,
                number,
                body=body,
                idempotency_key=idempotency_key,
                git_token=git_token,
            )
        )


class Tools:
    """The agent tools of `POST /v1/workspaces/{id}/tools/{tool}`, one typed method
    each; keywords are the fields of the tool's `ToolArgs.<tool>` schema."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def _call(
        self,
        workspace_id: str,
        name: str,
        args: dict[str, Any],
        git_token: str | Secret | None = None,
    ) -> Any:
        return self._client._send(_ops.tool(workspace_id, name, args, git_token=git_token))

    def view(
        self, workspace_id: str, path: str, *, range: tuple[int, int] | None = None
    ) -> m.TextOutput:
        """Numbered lines of a file (`range`: 1-based, end -1 for the end), or a listing."""
        r = list(range) if range is not None else None
        out: m.TextOutput = self._call(workspace_id, "view", {"path": path, "range": r})
        return out

    def create(self, workspace_id: str, path: str, content: str) -> m.WrittenOutput:
        """Create a file that must not exist yet."""
        out: m.WrittenOutput = self._call(
            workspace_id, "create", {"path": path, "content": content}
        )
        return out

    def str_replace(
        self, workspace_id: str, path: str, old_str: str, new_str: str
    ) -> m.WrittenOutput:
        """Replace the one occurrence of `old_str` (zero or several: `RejectedError`)."""
        out: m.WrittenOutput = self._call(
            workspace_id, "str_replace", {"path": path, "old_str": old_str, "new_str": new_str}
        )
        return out

    def insert(self, workspace_id: str, path: str, insert_line: int, text: str) -> m.WrittenOutput:
        """Insert `text` after line `insert_line` (0: at the top)."""
        out: m.WrittenOutput = self._call(
            workspace_id, "insert", {"path": path, "insert_line": insert_line, "text": text}
        )
        return out

    def read_file(self, workspace_id: str, path: str) -> m.FileOutput:
        out: m.FileOutput = self._call(workspace_id, "read_file", {"path": path})
        return out

    def write_file(self, workspace_id: str, path: str, content: str) -> m.WrittenOutput:
        """Write a whole file, creating it or replacing its content."""
        out: m.WrittenOutput = self._call(
            workspace_id, "write_file", {"path": path, "content": content}
        )
        return out

    def list_dir(self, workspace_id: str, path: str | None = None) -> m.DirOutput:
        out: m.DirOutput = self._call(workspace_id, "list_dir", {"path": path})
        return out

    def search(
        self,
        workspace_id: str,
        pattern: str,
        *,
        path: str | None = None,
        glob: Sequence[str] | None = None,
        regex: bool | None = None,
        case_sensitive: bool | None = None,
        max_results: int | None = None,
    ) -> m.SearchOutput:
        out: m.SearchOutput = self._call(
            workspace_id,
            "search",
            {
                "pattern": pattern,
                "path": path,
                "glob": list(glob) if glob is not None else None,
                "regex": regex,
                "case_sensitive": case_sensitive,
                "max_results": max_results,
            },
        )
        return out

    def git_status(self, workspace_id: str) -> m.StatusOutput:
        out: m.StatusOutput = self._call(workspace_id, "git_status", {})
        return out

    def git_diff(
        self,
        workspace_id: str,
        *,
        against: m.DiffAgainst | None = None,
        ref: str | None = None,
        paths: Sequence[str] | None = None,
    ) -> m.DiffOutput:
        """The diff against HEAD (default), the base commit, or `ref`."""
        if ref is not None and against is None:
            against = "ref"
        out: m.DiffOutput = self._call(
            workspace_id,
            "git_diff",
            {"against": against, "ref": ref, "paths": list(paths) if paths is not None else None},
        )
        return out

    def git_log(self, workspace_id: str, *, max_count: int | None = None) -> m.LogOutput:
        out: m.LogOutput = self._call(workspace_id, "git_log", {"max_count": max_count})
        return out

    def git_commit(
        self,
        workspace_id: str,
        message: str,
        *,
        paths: Sequence[str] | None = None,
        author_name: str | None = None,
        author_email: str | None = None,
    ) -> m.CommittedOutput:
        out: m.CommittedOutput = self._call(
            workspace_id,
            "git_commit",
            {
                "message": message,
                "paths": list(paths) if paths is not None else None,
                "author_name": author_name,
                "author_email": author_email,
            },
        )
        return out

    def git_push(
        self,
        workspace_id: str,
        *,
        branch: str | None = None,
        expect: str | None = None,
        force_with_lease: bool | None = None,
        set_upstream: bool | None = None,
        git_token: str | Secret | None = None,
    ) -> m.PushedOutput:
        out: m.PushedOutput = self._call(
            workspace_id,
            "git_push",
            {
                "branch": branch,
                "expect": expect,
                "force_with_lease": force_with_lease,
                "set_upstream": set_upstream,
            },
            git_token=git_token,
        )
        return out

    def history(
        self, workspace_id: str, *, offset: int | None = None, limit: int | None = None
    ) -> m.HistoryOutput:
        """The workspace's history: one point per change, oldest first (ADR 28)."""
        out: m.HistoryOutput = self._call(
            workspace_id, "history", {"offset": offset, "limit": limit}
        )
        return out

    def history_diff(
        self, workspace_id: str, since: str, *, until: str | None = None
    ) -> m.HistoryDiffOutput:
        """The diff between two points (numbers or snapshot ids), or a point and now."""
        out: m.HistoryDiffOutput = self._call(
            workspace_id, "history_diff", {"since": since, "until": until}
        )
        return out

    def history_file(self, workspace_id: str, point: str, path: str) -> m.FileOutput:
        """A file as it was at a point."""
        out: m.FileOutput = self._call(workspace_id, "history_file", {"point": point, "path": path})
        return out

    def checkpoint(self, workspace_id: str, name: str) -> m.PointOutput:
        """Records the workspace as it is now as a named point."""
        out: m.PointOutput = self._call(workspace_id, "checkpoint", {"name": name})
        return out

    def rewind(self, workspace_id: str, point: str) -> m.RewoundOutput:
        """Puts the files, HEAD and branch back to a point (refused while a command runs)."""
        out: m.RewoundOutput = self._call(workspace_id, "rewind", {"point": point})
        return out

    def undo(self, workspace_id: str) -> m.RewoundOutput:
        """Rewinds to the point before the latest change."""
        out: m.RewoundOutput = self._call(workspace_id, "undo", {})
        return out

    def fork(self, workspace_id: str, point: str, scope: str) -> m.ForkedOutput:
        """A new workspace at a point, under a new conversation or task id."""
        out: m.ForkedOutput = self._call(workspace_id, "fork", {"point": point, "scope": scope})
        return out


class ExecStream:
    """A streamed exec, open until iterated to its end or closed.

    `exec_id` is known after `ExecStarted`, `finished` after `ExecFinished`;
    `result()` reads the rest and returns what `Client.exec` would have.
    """

    def __init__(self, op: Op[Any], response: httpx.Response) -> None:
        self._op = op
        self._response = response
        self._events: Iterator[m.ExecEvent] | None = None
        self.exec_id: str | None = None
        self.finished: m.ExecFinished | None = None
        self.stdout: list[str] = []
        self.stderr: list[str] = []

    def __iter__(self) -> Iterator[m.ExecEvent]:
        if self._events is None:
            self._events = self._read()
        return self._events

    def _read(self) -> Iterator[m.ExecEvent]:
        decoder = SseDecoder()
        try:
            for line in self._response.iter_lines():
                msg = decoder.feed(line)
                if msg is None:
                    continue
                event = exec_event(msg, self._op)
                if event is None:
                    continue
                if isinstance(event, m.ExecStarted):
                    self.exec_id = event.exec_id
                elif isinstance(event, m.ExecOutput):
                    (self.stdout if event.stream == "stdout" else self.stderr).append(event.text)
                else:
                    self.finished = event
                yield event
                if self.finished is not None:
                    return
        except httpx.TransportError as e:
            raise TransportError(
                f"{self._op.describe()}: the stream broke ({type(e).__name__}); "
                f"exec {self.exec_id} may still finish (get_exec)"
            ) from None
        finally:
            self._response.close()
        raise ProtocolError(
            f"{self._op.describe()}: the stream ended before `finished`; "
            f"exec {self.exec_id} may still finish (get_exec)"
        )

    def result(self) -> m.ExecResult:
        """Reads the stream to its end; the collected result."""
        for _ in self:
            pass
        if self.finished is None or self.exec_id is None:
            raise ProtocolError(f"{self._op.describe()}: no `finished` event")
        f = self.finished
        return m.ExecResult(
            exec_id=f.exec_id,
            exit_code=f.exit_code,
            stdout="".join(self.stdout),
            stderr="".join(self.stderr),
            timed_out=f.timed_out,
            truncated=f.truncated,
            duration_ms=f.duration_ms,
        )

    def close(self) -> None:
        self._response.close()

    def __enter__(self) -> ExecStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class EventStream:
    """A followed events stream: iterate for `Event`s; `close()` (or `with`) ends it.

    `position` is the last position seen, where a reconnect resumes.
    """

    def __init__(self, client: Client, workspace_id: str, after: int | None) -> None:
        self._client = client
        self._workspace_id = workspace_id
        self.position = after
        self._response: httpx.Response | None = None
        self._closed = False
        self._events: Iterator[m.Event] | None = None
        # Open now, so that a missing workspace raises here rather than at the first
        # `next`.
        self._open()

    def _open(self) -> httpx.Response:
        op = _ops.events(self._workspace_id, after=self.position, limit=None, follow=True)
        self._response = self._client._request(op, stream=True)
        return self._response

    def __iter__(self) -> Iterator[m.Event]:
        if self._events is None:
            self._events = self._read()
        return self._events

    def _read(self) -> Iterator[m.Event]:
        failures = 0
        retry = self._client._retry
        while not self._closed:
            response = self._response or self._open()
            decoder = SseDecoder()
            try:
                for line in response.iter_lines():
                    msg = decoder.feed(line)
                    if msg is None:
                        continue
                    event = stream_event(msg)
                    if event is None:
                        continue
                    failures = 0
                    self.position = event.position
                    yield event
                why = "the server ended the stream"
            except httpx.TransportError as e:
                why = type(e).__name__
            finally:
                response.close()
                self._response = None
            if self._closed:
                return
            failures += 1
            if failures > retry.max_retries:
                raise TransportError(
                    f"following the events of {self._workspace_id}: {why}, "
                    f"{failures} times in a row"
                )
            log.info("events stream: %s; resuming after %s", why, self.position)
            time.sleep(retry.backoff * (2 ** (failures - 1)))

    def close(self) -> None:
        self._closed = True
        if self._response is not None:
            self._response.close()

    def __enter__(self) -> EventStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
