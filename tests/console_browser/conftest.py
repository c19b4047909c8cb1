"""Fixtures of the console's browser tests: a real `grove serve` (with its worker) on a
database of its own, users alice and bob and an operator, an edit workspace of alice's,
and headless Chromium driven over WebDriver (the distribution's chromium-driver)."""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import urllib.error
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pysupport"))

from grove_serve import ROOT, post, serve  # noqa: E402

SHOTS = ROOT / "target" / "console-screenshots"
ALICE = "alice-token-" + secrets.token_hex(8)
BOB = "bob-token-" + secrets.token_hex(8)
OPS = "ops-token-" + secrets.token_hex(8)


@dataclass
class Grove:
    base: str
    workspace: str

    def api(self, path: str, token: str, body: dict) -> dict:
        return post(self.base, path, token, body)

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


@pytest.fixture(scope="session")
def grove() -> Iterator[Grove]:
    tokens = f"{ALICE}=alice,{BOB}=bob,{OPS}=ops:operator"
    # Sweeps every few seconds: the disk chart draws the water marks of the last one.
    with serve("console", tokens, "*/3 * * * * *") as s:
        g = Grove(s.base, "")
        session = g.api("/v1/sessions", ALICE, {
            "project_id": "web", "repo_name": "o/fixture", "repo_url": s.repo_url,
            "base_ref": "main", "mode": "edit", "conversation_id": "console-browser",
        })
        g.workspace = session["workspace"]["id"]
        yield g


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
