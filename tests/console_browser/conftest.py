"""Fixtures of the console's browser tests: a real `grove serve` (with its worker) on a
database of its own, users alice and bob and an operator, an edit workspace of alice's,
and headless Chromium driven over WebDriver (the distribution's chromium-driver)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]
GROVE = Path(os.environ.get("GROVE_BIN", ROOT / "target" / "debug" / "grove"))
SHOTS = ROOT / "target" / "console-screenshots"
ALICE = "alice-token-" + secrets.token_hex(8)
BOB = "bob-token-" + secrets.token_hex(8)
OPS = "ops-token-" + secrets.token_hex(8)


@dataclass
class Grove:
    base: str
    workspace: str

    def api(self, path: str, token: str, body: dict) -> dict:
        req = urllib.request.Request(
            self.base + path,
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=120) as resp:
            return json.load(resp)

    def fail_a_command(self, token: str) -> int:
        """A tool command that fails on the worker (no such file); returns the status."""
        try:
            self.api(f"/v1/workspaces/{self.workspace}/tools/str_replace", token,
                     {"path": "no-such-file.txt", "old_str": "a", "new_str": "b"})
        except urllib.error.HTTPError as e:
            return e.code
        return 200

    def exec(self, token: str, argv: list[str]) -> dict:
        return self.api(f"/v1/workspaces/{self.workspace}/exec", token, {"argv": argv})


def _database(base_url: str) -> tuple[str, str]:
    name = "grove_console_" + secrets.token_hex(4)
    subprocess.run(["psql", base_url, "-qc", f"CREATE DATABASE {name}"], check=True)
    parts = urllib.parse.urlsplit(base_url)
    return name, urllib.parse.urlunsplit(parts._replace(path="/" + name))


def _fixture_repo(root: Path) -> str:
    repo = root / "repos" / "fixture"
    repo.mkdir(parents=True)
    (repo / "README.md").write_text("hello\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-qm", "init"], check=True)
    return f"file://{repo}"


@pytest.fixture(scope="session")
def grove() -> Iterator[Grove]:
    base_url = os.environ.get("GROVE_TEST_DATABASE_URL")
    if not base_url:
        if os.environ.get("GROVE_TEST_REQUIRE_DB") == "1":
            pytest.fail("GROVE_TEST_REQUIRE_DB=1 but GROVE_TEST_DATABASE_URL is unset")
        pytest.skip("GROVE_TEST_DATABASE_URL is unset: no Postgres to run grove against")
    if not GROVE.exists():
        pytest.fail(f"{GROVE} does not exist: build it with `cargo build -p grove-cli`")
    tmp = Path(tempfile.mkdtemp(prefix="grove-console-"))
    name, url = _database(base_url)
    repo_url = _fixture_repo(tmp)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "DATABASE_URL": url,
        "GROVE_HOME": str(tmp / "home"),
        "GROVE_LOCAL_REPO_ROOTS": str(tmp / "repos"),
        "GROVE_API_TOKENS": f"{ALICE}=alice,{BOB}=bob,{OPS}=ops:operator",
        # Sweeps every few seconds: the disk chart draws the water marks of the last one.
        "GROVE_EVICT_SCHEDULE": "*/3 * * * * *",
        "GROVE_LOG": "warn",
    }
    server = subprocess.Popen(
        [str(GROVE), "serve", "--bind", "127.0.0.1:0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=open(tmp / "serve.log", "w"),
        text=True,
    )
    try:
        assert server.stdout is not None
        first = server.stdout.readline().strip()
        assert first.startswith("grove: listening on "), first
        base = first.removeprefix("grove: listening on ")
        g = Grove(base, "")
        session = g.api("/v1/sessions", ALICE, {
            "project_id": "web", "repo_name": "o/fixture", "repo_url": repo_url,
            "base_ref": "main", "mode": "edit", "conversation_id": "console-browser",
        })
        g.workspace = session["workspace"]["id"]
        yield g
    finally:
        server.terminate()
        server.wait(timeout=30)
        subprocess.run(["psql", base_url, "-qc", f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"])


def _chromium() -> tuple[str, str]:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver") or "/usr/lib/chromium/chromedriver"
    if not browser or not Path(driver).exists():
        if os.environ.get("GROVE_TEST_REQUIRE_BROWSER") == "1":
            pytest.fail("GROVE_TEST_REQUIRE_BROWSER=1 but chromium or chromedriver is missing")
        pytest.skip("chromium and chromium-driver are not installed (./scripts/test installs them)")
    return browser, driver


@pytest.fixture()
def browser() -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = _chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1400,1000", "--disable-gpu"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.implicitly_wait(0)
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        yield driver
    finally:
        driver.quit()
