"""What the sync and async clients share: requests as data (`Op`), answers parsed into
models or exceptions, the retry rule, server-sent events, and the secret wrapper.

Each client method builds an `Op` with a function of `_ops` and hands it to its
transport (`Client._send` or `AsyncClient._send`), which only sends, sleeps and reads.
So request building, parsing, the error mapping and the retry decision exist once, and
the two clients cannot disagree on them.
"""

from __future__ import annotations

import email.utils
import enum
import json
import os
import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx

from . import models
from .errors import ApiError, ProtocolError, error_for

T = TypeVar("T")

GIT_TOKEN_HEADER = "X-Grove-Git-Token"
USER_AGENT = "grove-client-python/0.1.0"


class Secret:
    """A token: its text is reachable only through `reveal()`, never `repr` or `str`.

    Both the bearer token and git tokens are held this way, so a client, an `Op` or a
    traceback's locals printed in a log show `Secret('***')`.
    """

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        if not isinstance(value, str) or not value:
            raise ValueError("a token must be a non-empty string")
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        raise TypeError("a Secret is not picklable")


def from_environment() -> tuple[str, Secret]:
    """`GROVE_URL` and `GROVE_TOKEN`, the variables the CLI's calls over HTTP read
    (docs/configuration.md)."""
    url, token = os.environ.get("GROVE_URL"), os.environ.get("GROVE_TOKEN")
    missing = [n for n, v in (("GROVE_URL", url), ("GROVE_TOKEN", token)) if not v]
    if missing:
        raise ValueError(f"{' and '.join(missing)} not set (a grove server and its bearer token)")
    assert url is not None and token is not None
    return url, Secret(token)


class BearerAuth(httpx.Auth):
    """Adds `Authorization: Bearer` to each request as it is sent; httpx's own repr of
    headers masks it too (`[secure]`)."""

    def __init__(self, token: Secret) -> None:
        self._token = token

    def auth_flow(self, request: httpx.Request) -> Any:
        request.headers["Authorization"] = f"Bearer {self._token.reveal()}"
        yield request

    def __repr__(self) -> str:
        return "BearerAuth(Secret('***'))"


@dataclass(frozen=True)
class RetryPolicy:
    """How answers of 429 and 503 are retried.

    At most `max_retries` more attempts; each waits the answer's `Retry-After` (seconds
    or an HTTP date) when it has one, else `backoff * 2**attempt` with up to 25 %
    jitter, capped at `max_backoff`. A `Retry-After` longer than `max_retry_after` is
    not waited for: the error is raised at once. `RetryPolicy(max_retries=0)` turns
    retries off.
    """

    max_retries: int = 3
    backoff: float = 0.5
    max_backoff: float = 8.0
    max_retry_after: float = 30.0

    def delay(self, attempt: int, response: httpx.Response) -> float | None:
        """Seconds to wait before retrying after `response` (the `attempt`-th retry,
        from 0), or None when it is not retried."""
        if response.status_code not in RETRY_STATUSES or attempt >= self.max_retries:
            return None
        after = retry_after(response.headers.get("Retry-After"))
        if after is not None:
            return after if after <= self.max_retry_after else None
        base: float = min(self.max_backoff, self.backoff * float(2**attempt))
        return base * (1 + random.random() / 4)


RETRY_STATUSES = frozenset({429, 503})


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """The seconds a `Retry-After` header asks for (RFC 9110: delay-seconds or an
    HTTP date), or None when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class _Default(enum.Enum):
    DEFAULT = "default"


#: The client's own timeout (`Op.read_timeout`).
DEFAULT = _Default.DEFAULT

#: How long a stream may stay silent: grove sends a keep-alive every 15 s, so a
#: silent minute means the connection is gone.
STREAM_READ_TIMEOUT = 60.0


@dataclass(frozen=True)
class Op(Generic[T]):
    """One request and how its answer is read.

    `repeatable` says that sending it again cannot run its effect twice (a read, an
    operation grove makes idempotent, or one carrying an idempotency key), which is
    what allows a retry after grove itself answered 429 or 503; answers that do not
    come from grove (a proxy's 503 without grove's error envelope) mean the request
    never reached it and are retried either way.

    `read_timeout` is how long to wait for the answer: `DEFAULT` is the client's;
    None waits as long as it takes, for an operation that waits on a job's outcome
    (the command may rightly run for an hour); a stream's is `STREAM_READ_TIMEOUT`.
    """

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    body: Any = None
    params: Mapping[str, str] | None = None
    git_token: Secret | None = None
    #: Sent as `Idempotency-Key` (a tool call's key: a retry answers the first outcome).
    idempotency_key: str | None = None
    repeatable: bool = False
    has_body: bool = field(default=False)
    read_timeout: float | _Default | None = DEFAULT
    #: The operation of docs/openapi.json (method, path template): logged with each
    #: answer (`extra={"grove_route": ...}`), which the SDK's tests use to check that
    #: every operation was exercised.
    route: tuple[str, str] | None = None
    #: The `Accept` header, when not JSON's alone (MCP's transport wants both).
    accept: str | None = None

    def describe(self) -> str:
        return f"{self.method} {self.path}"


def segment(value: str | int) -> str:
    """A path segment, percent-encoded (ids are untrusted text too)."""
    return quote(str(value), safe="")


def compact(values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` without the entries that are None (absent means default)."""
    return {k: v for k, v in values.items() if v is not None}


def query(values: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in values.items():
        if v is None:
            continue
        out[k] = ("true" if v else "false") if isinstance(v, bool) else str(v)
    return out


def build_request(
    http: httpx.Client | httpx.AsyncClient, op: Op[Any], timeout: httpx.Timeout
) -> httpx.Request:
    headers: dict[str, str] = {}
    content: bytes | None = None
    if op.has_body:
        headers["Content-Type"] = "application/json"
        content = json.dumps(op.body if op.body is not None else {}).encode()
    if op.git_token is not None:
        headers[GIT_TOKEN_HEADER] = op.git_token.reveal()
    if op.idempotency_key is not None:
        headers["Idempotency-Key"] = op.idempotency_key
    if op.accept is not None:
        headers["Accept"] = op.accept
    if not isinstance(op.read_timeout, _Default):
        timeout = httpx.Timeout(
            connect=timeout.connect, read=op.read_timeout, write=timeout.write, pool=timeout.pool
        )
    return http.build_request(
        op.method, op.path, params=op.params, headers=headers, content=content, timeout=timeout
    )


def body_json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError as e:
        raise ProtocolError(
            f"{response.request.method} {response.request.url.path}: "
            f"answer {response.status_code} is not JSON"
        ) from e


def parser(cls: type[T]) -> Callable[[httpx.Response], T]:
    """Reads a JSON answer as the model `cls`."""

    def parse(response: httpx.Response) -> T:
        return models.from_json(cls, body_json(response))

    return parse


def parse_none(response: httpx.Response) -> None:
    return None


def parse_tool(cls: type[T]) -> Callable[[httpx.Response], T]:
    """Reads a tool's answer and checks that its `output` tag is the expected one."""

    def parse(response: httpx.Response) -> T:
        out = models.tool_output(body_json(response))
        if not isinstance(out, cls):
            raise ProtocolError(f"expected {cls.__name__}, got {type(out).__name__}")
        return out

    return parse


def envelope(data: Any) -> models.ErrorBody | None:
    """The `error` of grove's error envelope, or None when `data` is not one."""
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        try:
            return models.from_json(models.ErrorBody, data["error"])
        except ProtocolError:
            return None
    return None


def is_grove_error(response: httpx.Response) -> bool:
    """Whether an error answer carries grove's envelope (it came from grove, not from
    something in front of it). Reads the body: call it on a read response."""
    try:
        return envelope(json.loads(response.content)) is not None
    except ValueError:
        return False


def error_from(response: httpx.Response, op: Op[Any]) -> ApiError:
    """The exception of an error answer (its body read)."""
    try:
        body = envelope(json.loads(response.content))
    except ValueError:
        body = None
    if body is None:
        text = response.text.strip().splitlines()
        message = text[0][:200] if text else (response.reason_phrase or "no body")
        return error_for(
            status=response.status_code, kind=None, message=message, request=op.describe()
        )
    return error_for(
        status=response.status_code,
        kind=body.kind,
        message=body.message,
        paths=tuple(body.paths),
        request=op.describe(),
    )


def retry_delay(
    policy: RetryPolicy, attempt: int, response: httpx.Response, op: Op[Any]
) -> float | None:
    """Seconds to wait before sending `op` again after `response` (read), or None."""
    delay = policy.delay(attempt, response)
    if delay is None:
        return None
    if op.repeatable or not is_grove_error(response):
        return delay
    return None


# --- Server-sent events --------------------------------------------------------------


@dataclass
class SseMessage:
    event: str = "message"
    data: str = ""
    id: str | None = None


class SseDecoder:
    """The event-stream format (WHATWG HTML, "Server-sent events"), fed line by line.

    `feed` returns the message a blank line completes, if any. Comments (`:` lines,
    grove's keep-alives) and unknown fields are skipped; `data` lines are joined with
    newlines.
    """

    def __init__(self) -> None:
        self._event = ""
        self._data: list[str] = []
        self._id: str | None = None
        self.last_id: str | None = None

    def feed(self, line: str) -> SseMessage | None:
        line = line.rstrip("\r\n")
        if not line:
            if not self._data and not self._event:
                return None
            msg = SseMessage(self._event or "message", "\n".join(self._data), self._id)
            if self._id is not None:
                self.last_id = self._id
            self._event, self._data, self._id = "", [], None
            return msg
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id" and "\0" not in value:
            self._id = value
        return None

    def feed_all(self, lines: Iterable[str]) -> list[SseMessage]:
        return [m for m in (self.feed(line) for line in lines) if m is not None]


def sse_json(msg: SseMessage) -> Any:
    try:
        return json.loads(msg.data)
    except ValueError as e:
        raise ProtocolError(f"server-sent event {msg.event!r}: data is not JSON") from e


def exec_event(msg: SseMessage, op: Op[Any]) -> models.ExecEvent | None:
    """A streamed exec's message as its model; the `error` event raised as the
    exception of its kind; None for a message this client does not know."""
    if msg.event == "started":
        return models.from_json(models.ExecStarted, sse_json(msg))
    if msg.event == "output":
        return models.from_json(models.ExecOutput, sse_json(msg))
    if msg.event == "finished":
        return models.from_json(models.ExecFinished, sse_json(msg))
    if msg.event == "error":
        body = envelope(sse_json(msg))
        if body is None:
            raise ProtocolError("a streamed exec's `error` event without an error body")
        raise error_for(
            status=200,
            kind=body.kind,
            message=body.message,
            paths=tuple(body.paths),
            request=op.describe(),
        )
    return None


def stream_event(msg: SseMessage) -> models.Event | None:
    """A followed events stream's message as its `Event` (None for others)."""
    if not msg.data:
        return None
    return models.from_json(models.Event, sse_json(msg))
