"""What the client raises: one exception class per `error.kind` of grove's error envelope.

Every error the server answers is `{"error": {"kind", "message", "paths"?}}` with a status
that follows from the kind (docs/http-api.md). The kind, not the status, picks the class,
so `except NotFoundError` catches a missing workspace whether it came as a 404 from a
read or as the failed outcome of a job. An answer without the envelope (a proxy's 503
page) or with a kind this version does not know gets the class of its status
(`STATUS_CLASSES`: a 503 is still an `UnavailableError`), else `ApiError`; `kind` is
then None or the unknown kind's text.

Messages are the server's one line, which never carries secrets; the client adds the
method and path of the request, never its headers (the bearer token and the git token
travel only there).
"""

from __future__ import annotations

import re
from typing import Final


class GroveError(Exception):
    """Base of everything this package raises."""


class TransportError(GroveError):
    """The request did not get an answer: connection refused or cut, or a timeout.

    Handling: whether the command ran is unknown; repeat it with the same
    `idempotency_key` where the operation takes one.
    """


class ProtocolError(GroveError):
    """The server answered something this client cannot read (a stream that ended
    before its `finished` event, a body that is not the documented JSON)."""


class ApiError(GroveError):
    """The server answered with an error status.

    `kind` is the envelope's `error.kind` (None when the body had no envelope),
    `message` its one line, `paths` the workspace-relative paths the failure is about
    (merge-back conflicts), `status` the HTTP status.
    """

    kind_name: str | None = None

    def __init__(
        self,
        message: str,
        *,
        status: int,
        kind: str | None,
        paths: tuple[str, ...] = (),
        request: str = "",
    ) -> None:
        self.message = message
        self.status = status
        self.kind = kind
        self.paths = paths
        self.request = request
        where = f" ({request})" if request else ""
        super().__init__(f"{status} {kind or 'error'}: {message}{where}")

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only arguments: rebuilt explicitly, so the error crosses processes.
        return (
            _rebuild,
            (type(self), self.message, self.status, self.kind, self.paths, self.request),
        )


def _rebuild(
    cls: type[ApiError],
    message: str,
    status: int,
    kind: str | None,
    paths: tuple[str, ...],
    request: str,
) -> ApiError:
    return cls(message, status=status, kind=kind, paths=paths, request=request)


class UnauthorizedError(ApiError):
    """401: no bearer token, or one the server does not know. Handling: fix the token."""

    kind_name = "unauthorized"


class InvalidInputError(ApiError):
    """400 (413, 415, some 422): a malformed id, body, path, ref or name. Handling:
    fix the request; repeating it fails the same way."""

    kind_name = "invalid_input"


class NotFoundError(ApiError):
    """404: no such workspace, exec, file, tool or pull request, or one the caller may
    not see (another user's workspace answers exactly as a missing one)."""

    kind_name = "not_found"


class ConflictError(ApiError):
    """409: the state forbids it now (the file exists, the workspace is evicted or
    locked, a merge-back conflicts: `paths` names every conflicting path). Handling:
    look at the state; a lock conflict may pass when repeated."""

    kind_name = "conflict"


class WorkspaceEvictedError(ConflictError):
    """409 for a workspace whose files eviction removed (its work saved). Handling:
    `restore_workspace` (or acquiring it again) brings it back, same id and branch.

    grove has no kind of its own for it: the server says `conflict` with the message
    "workspace ID is evicted ...", which is what picks this class (a test against a
    real eviction keeps the two in step). `except ConflictError` still catches it.
    """

    kind_name = "conflict"


_EVICTED = re.compile(r"^workspace [0-9a-f-]{36} is evicted\b")


class RejectedError(ApiError):
    """422: well-formed but refused (a write tool on a read-only workspace, `old_str`
    not found exactly once, nothing to commit, uncommitted paths in `paths`)."""

    kind_name = "rejected"


class AuthFailedError(ApiError):
    """403: the git remote or the git platform refused the credentials sent in
    `git_token`."""

    kind_name = "auth_failed"


class ResourceLimitError(ApiError):
    """429: a resource limit was hit (the platform's rate limit, too many sessions).
    Retried by the client (bounded, honouring `Retry-After`) before it is raised."""

    kind_name = "resource_limit"


class UnavailableError(ApiError):
    """503: no worker took the job, the runtime or the platform is unavailable.
    Retried by the client (bounded, honouring `Retry-After`) before it is raised."""

    kind_name = "unavailable"


class WorkerLostError(ApiError):
    """500: the worker running the command died and the command was not run again.
    Handling: look at the workspace before repeating a command that writes."""

    kind_name = "worker_lost"


class InternalError(ApiError):
    """500: the server failed (details are in its log, never in the answer)."""

    kind_name = "internal"


#: The class of each error kind grove documents (`ErrorKind` in docs/openapi.json);
#: a test keeps the two equal.
ERROR_CLASSES: Final[dict[str, type[ApiError]]] = {
    cls.kind_name: cls
    for cls in (
        UnauthorizedError,
        InvalidInputError,
        NotFoundError,
        ConflictError,
        RejectedError,
        AuthFailedError,
        ResourceLimitError,
        UnavailableError,
        WorkerLostError,
        InternalError,
    )
    if cls.kind_name is not None
}


#: The class of an answer whose kind is absent (no envelope: a proxy's page) or not
#: one of `ERROR_CLASSES` (a kind newer than this client), by status: the kinds'
#: statuses (docs/http-api.md), so `except UnavailableError` also catches a load
#: balancer's 503.
STATUS_CLASSES: Final[dict[int, type[ApiError]]] = {
    400: InvalidInputError,
    401: UnauthorizedError,
    403: AuthFailedError,
    404: NotFoundError,
    409: ConflictError,
    413: InvalidInputError,
    415: InvalidInputError,
    422: RejectedError,
    429: ResourceLimitError,
    503: UnavailableError,
}


def error_for(
    *,
    status: int,
    kind: str | None,
    message: str,
    paths: tuple[str, ...] = (),
    request: str = "",
) -> ApiError:
    """The exception of an error answer: the kind's class, else the status's, else
    `ApiError`; `kind` keeps the text the server sent."""
    cls = ERROR_CLASSES.get(kind or "") or STATUS_CLASSES.get(status, ApiError)
    if cls is ConflictError and _EVICTED.match(message):
        cls = WorkspaceEvictedError
    return cls(message, status=status, kind=kind, paths=paths, request=request)
