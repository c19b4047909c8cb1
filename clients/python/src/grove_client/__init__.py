"""grove-client: the Python client of grove's HTTP API (`grove serve`).

```python
from grove_client import Client

with Client("http://127.0.0.1:8080", token=token) as grove:
    s = grove.acquire_session(project_id="p", repo_name="o/r", repo_url=url,
                              base_ref="main", mode="edit", conversation_id="c1")
    grove.tools.str_replace(s.session_id, "README.md", "old", "new")
    print(grove.exec(s.session_id, ["git", "diff"]).stdout)
```

# Layout

- `client`: `Client` (synchronous), `Tools`, `ExecStream`, `EventStream`.
- `aio`: `AsyncClient` and its async counterparts, method for method.
- `_ops`: every API operation as a function returning an `Op`; `ROUTES` maps the
  document's operations to client methods.
- `_core`: what both clients share: request building, parsing, the error mapping, the
  retry rule, server-sent events, `Secret`.
- `models`: the answers' dataclasses, named after docs/openapi.json's schemas.
- `errors`: one exception class per `error.kind`.
"""

from ._core import RetryPolicy, Secret
from .aio import AsyncClient, AsyncEventStream, AsyncExecStream, AsyncTools
from .client import Client, EventStream, ExecStream, Tools
from .errors import (
    ERROR_CLASSES,
    ApiError,
    AuthFailedError,
    ConflictError,
    GroveError,
    InternalError,
    InvalidInputError,
    NotFoundError,
    ProtocolError,
    RejectedError,
    ResourceLimitError,
    TransportError,
    UnauthorizedError,
    UnavailableError,
    WorkerLostError,
    WorkspaceEvictedError,
)
from .models import (
    Event,
    EventsPage,
    ExecFinished,
    ExecOutput,
    ExecResult,
    ExecStarted,
    Session,
    ToolOutput,
    Workspace,
)

__version__ = "0.1.0"

__all__ = [
    "ERROR_CLASSES",
    "ApiError",
    "AsyncClient",
    "AsyncEventStream",
    "AsyncExecStream",
    "AsyncTools",
    "AuthFailedError",
    "Client",
    "ConflictError",
    "Event",
    "EventStream",
    "EventsPage",
    "ExecFinished",
    "ExecOutput",
    "ExecResult",
    "ExecStarted",
    "ExecStream",
    "GroveError",
    "InternalError",
    "InvalidInputError",
    "NotFoundError",
    "ProtocolError",
    "RejectedError",
    "ResourceLimitError",
    "RetryPolicy",
    "Secret",
    "Session",
    "ToolOutput",
    "Tools",
    "TransportError",
    "UnauthorizedError",
    "UnavailableError",
    "WorkerLostError",
    "Workspace",
    "WorkspaceEvictedError",
]
