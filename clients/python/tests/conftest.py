"""Fixtures: a real `grove serve` on a fresh database of a real Postgres, and real git
repositories. Nothing of grove is mocked.

- The binary is `$GROVE_BIN`, else `target/debug/grove` of this repository.
- Postgres is `$GROVE_TEST_DATABASE_URL` (what ./scripts/test exports), else
  `$DATABASE_URL`, else grove's private cluster started with `grove db start` under
  `${TMPDIR:-/tmp}/grove-py-sdk-pg` (left running, as ./scripts/test leaves its own).
  Each server gets a database of its own, dropped afterwards.
- Without a binary or Postgres the tests are skipped with the reason, unless
  `GROVE_TEST_REQUIRE_DB=1` (./scripts/test), which turns that into a failure.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from grove_client import AsyncClient, Client, RetryPolicy, Session

REPO_ROOT = Path(__file__).resolve().parents[3]
ALICE = "alice-token-py-0123456789abcdef"
BOB = "bob-token-py-0123456789abcdef"
OPS = "ops-token-py-0123456789abcdef"
TOKENS = f"{ALICE}=alice,{BOB}=bob,{OPS}=ops:operator"


def _unavailable(why: str) -> None:
    if os.environ.get("GROVE_TEST_REQUIRE_DB") == "1":
        pytest.fail(f"GROVE_TEST_REQUIRE_DB=1 but {why}", pytrace=False)
    pytest.skip(why)


def _pg_bin(name: str) -> str:
    for d in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (d / name).exists():
            return str(d / name)
    found = shutil.which(name)
    if found is None:
        _unavailable(f"no {name} (Postgres client) found")
    assert found is not None
    return found


def git(cwd: Path, *args: str) -> str:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(cwd),
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    out = subprocess.run(
        ["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True
    )
    return out.stdout


#: Every operation (method, path template) the clients sent this session, from the
#: `grove_route` of the client's per-answer log records; checked by test_zz_coverage.
EXERCISED: set[tuple[str, str]] = set()


class _RouteRecorder(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        route = getattr(record, "grove_route", None)
        if route is not None:
            EXERCISED.add(route)


@pytest.fixture(scope="session", autouse=True)
def record_routes() -> Iterator[None]:
    logger = logging.getLogger("grove_client")
    handler = _RouteRecorder(logging.DEBUG)
    previous = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    yield
    logger.removeHandler(handler)
    logger.setLevel(previous)


@pytest.fixture(scope="session")
def grove_bin() -> Path:
    path = Path(os.environ.get("GROVE_BIN") or REPO_ROOT / "target" / "debug" / "grove")
    if not path.is_file():
        _unavailable(f"{path} not found: build it first (cargo build -p grove-cli)")
    return path


@pytest.fixture(scope="session")
def admin_url(grove_bin: Path) -> str:
    url = os.environ.get("GROVE_TEST_DATABASE_URL") or os.environ.get("DATABASE_URL")
    if url:
        return url
    home = Path(os.environ.get("TMPDIR", "/tmp")) / "grove-py-sdk-pg"
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["GROVE_HOME"] = str(home)
    out = subprocess.run(
        [str(grove_bin), "db", "start"], env=env, capture_output=True, text=True, timeout=120
    )
    if out.returncode != 0:
        _unavailable(f"`grove db start` failed: {out.stderr.strip()[-500:]}")
    return out.stdout.strip().splitlines()[-1]


def _with_database(url: str, db: str) -> str:
    base, sep, q = url.partition("?")
    head, _, _ = base.rpartition("/")
    return f"{head}/{db}{sep}{q}"


@dataclass
class Grove:
    """A running `grove serve` with its database, `$GROVE_HOME` and repositories."""

    base_url: str
    root: Path
    db_url: str
    admin_url: str
    db_name: str
    proc: subprocess.Popen[str]
    log: Path
    repos: dict[str, str] = field(default_factory=dict)

    def client(self, token: str = ALICE, **kw: Any) -> Client:
        kw.setdefault("retry", RetryPolicy(max_retries=2, backoff=0.05))
        return Client(self.base_url, token, **kw)

    def aclient(self, token: str = ALICE, **kw: Any) -> AsyncClient:
        kw.setdefault("retry", RetryPolicy(max_retries=2, backoff=0.05))
        return AsyncClient(self.base_url, token, **kw)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def repo(self, name: str, files: dict[str, str]) -> str:
        """A git repository with `files` committed on `main`; its file:// URL."""
        if name in self.repos:
            return self.repos[name]
        d = self.root / "upstream" / name
        d.mkdir(parents=True)
        git(d, "init", "-q", "-b", "main")
        for path, content in files.items():
            p = d / path
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(content)
        git(d, "add", "-A")
        git(d, "commit", "-q", "-m", "initial")
        self.repos[name] = f"file://{d}"
        return self.repos[name]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        subprocess.run(
            [
                _pg_bin("psql"),
                self.admin_url,
                "-q",
                "-c",
                f"DROP DATABASE IF EXISTS {self.db_name}",
            ],
            capture_output=True,
            timeout=60,
        )


def start_grove(
    grove_bin: Path,
    admin_url: str,
    root: Path,
    *,
    args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> Grove:
    """A fresh database, migrated, and `grove serve --bind 127.0.0.1:0` on it."""
    db_name = f"grove_py_{uuid.uuid4().hex}"
    created = subprocess.run(
        [_pg_bin("psql"), admin_url, "-q", "-c", f"CREATE DATABASE {db_name}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if created.returncode != 0:
        _unavailable(f"cannot create a database on {admin_url}: {created.stderr.strip()}")
    db_url = _with_database(admin_url, db_name)
    (root / "home").mkdir(parents=True, exist_ok=True)
    base_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "DATABASE_URL": db_url,
        "GROVE_HOME": str(root / "home"),
        "GROVE_LOCAL_REPO_ROOTS": str(root),
        "GROVE_LOG": "info",
        "GROVE_EVICT_SCHEDULE": "off",
        "GROVE_API_TOKENS": TOKENS,
    }
    base_env.update(env or {})
    migrated = subprocess.run(
        [str(grove_bin), "migrate"], env=base_env, capture_output=True, text=True, timeout=120
    )
    assert migrated.returncode == 0, f"grove migrate failed: {migrated.stderr}"
    log = root / "serve.log"
    proc = subprocess.Popen(
        [str(grove_bin), "serve", "--bind", "127.0.0.1:0", *args],
        env=base_env,
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
        text=True,
    )
    first: list[str] = []
    reader = threading.Thread(
        target=lambda: first.append(proc.stdout.readline() if proc.stdout else "")
    )
    reader.start()
    reader.join(timeout=60)
    line = first[0].strip() if first else ""
    prefix = "grove: listening on "
    if not line.startswith(prefix):
        proc.kill()
        raise AssertionError(f"grove serve printed {line!r}; log: {log.read_text()[-2000:]}")

    # Drain the rest of stdout so the server never blocks on a full pipe.
    def drain() -> None:
        assert proc.stdout is not None
        for _ in proc.stdout:
            pass

    threading.Thread(target=drain, daemon=True).start()
    return Grove(
        base_url=line[len(prefix) :],
        root=root,
        db_url=db_url,
        admin_url=admin_url,
        db_name=db_name,
        proc=proc,
        log=log,
    )


@pytest.fixture(scope="session")
def grove(
    grove_bin: Path, admin_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Grove]:
    """The shared server (with its in-process worker) most tests use; tests keep out of
    each other's way by using their own conversation ids."""
    g = start_grove(grove_bin, admin_url, tmp_path_factory.mktemp("grove"))
    yield g
    g.stop()


FILES = {
    "README.md": "# fixture\nhello world\n",
    "src/app.py": "def main():\n    return 'old'\n",
    "notes.txt": "one\ntwo\nthree\n",
}


@pytest.fixture(scope="session")
def repo_url(grove: Grove) -> str:
    return grove.repo("fixture", FILES)


@pytest.fixture
def alice(grove: Grove) -> Iterator[Client]:
    with grove.client(ALICE) as c:
        yield c


def acquire(
    client: Client,
    repo_url: str,
    *,
    mode: str = "edit",
    conversation: str | None = None,
    task: str | None = None,
) -> Session:
    conversation = conversation or (f"c-{uuid.uuid4().hex[:12]}" if mode == "edit" else None)
    if mode == "task":
        task = task or f"t-{uuid.uuid4().hex[:12]}"
    return client.acquire_session(
        project_id="p1",
        repo_name="o/fixture",
        repo_url=repo_url,
        base_ref="main",
        mode=mode,  # type: ignore[arg-type]
        conversation_id=conversation,
        task_id=task,
    )


@pytest.fixture
def session(alice: Client, repo_url: str) -> Session:
    """A fresh edit session of alice's."""
    return acquire(alice, repo_url)
