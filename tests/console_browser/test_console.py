"""The operator console in a real browser (headless Chromium over WebDriver) against a
real `grove serve`: sign-in, Fleet, a workspace's timeline with kept output, live
follow without a reload, tenancy, escaping, a step's diff and a rewind through its
confirmation page, and no console errors on any page.
Screenshots of each page go to target/console-screenshots/."""

from __future__ import annotations

import time

from conftest import ALICE, BOB, OPS, SHOTS, Grove
from selenium.common.exceptions import NoAlertPresentException, WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait


def console_errors(driver, allow: tuple[str, ...] = ()) -> list[str]:
    """Severe browser console entries (script errors, CSP violations, failed loads)."""
    return [
        e["message"] for e in driver.get_log("browser")
        if e["level"] == "SEVERE" and not any(a in e["message"] for a in allow)
    ]


def sign_in(driver, grove: Grove, token: str) -> None:
    driver.delete_all_cookies()
    driver.get(grove.base + "/ui/workspaces")
    assert driver.current_url.endswith("/ui/login"), "no cookie: redirected to the login form"
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.ID, "sign-in").click()
    navigating(driver, 10).until(ec.presence_of_element_located((By.ID, "viewer")))


def navigating(driver, seconds: float) -> WebDriverWait:
    """A wait across a page load. While the old page unloads, ChromeDriver may answer a
    query with an "inspector error" rather than a stale reference or no element: that too
    means "not yet"."""
    return WebDriverWait(driver, seconds, ignored_exceptions=(WebDriverException,))


def shot(driver, name: str) -> None:
    driver.save_screenshot(str(SHOTS / f"console-{name}.png"))


def test_an_operator_signs_in_and_fleet_shows_the_worker(grove: Grove, browser) -> None:
    assert grove.fail_a_command(ALICE) >= 400
    sign_in(browser, grove, OPS)
    assert browser.current_url.endswith("/ui/fleet")
    workers = browser.find_element(By.ID, "workers").text
    assert "grove:node:" in workers, workers
    assert browser.find_element(By.CSS_SELECTOR, "#workers td.node").text not in ("", "—")
    failures = browser.find_element(By.ID, "failures").text
    assert "tool" in failures and "not_found" in failures, failures
    shot(browser, "fleet")
    assert console_errors(browser) == []


def test_the_timeline_shows_output_and_follows_a_new_command_live(grove: Grove, browser) -> None:
    grove.exec(ALICE, ["echo", "browser-output-1"])
    grove.exec(ALICE, ["sh", "-c", "echo '<script>alert(1)</script>' && echo done"])
    sign_in(browser, grove, ALICE)
    browser.get(f"{grove.base}/ui/workspaces/{grove.workspace}")
    timeline = browser.find_element(By.ID, "timeline")
    assert "browser-output-1" in timeline.text
    assert "echo browser-output-1" in timeline.text, "the argv"
    assert "<script>alert(1)</script>" in timeline.text, "markup is shown as text"
    try:
        browser.switch_to.alert
        raise AssertionError("a script from the output ran")
    except NoAlertPresentException:
        pass
    WebDriverWait(browser, 10).until(ec.visibility_of_element_located((By.ID, "live")))
    browser.execute_script("window.groveNoReload = 42;")
    grove.exec(ALICE, ["echo", "live-output-2"])
    WebDriverWait(browser, 20).until(
        lambda d: "live-output-2" in d.find_element(By.ID, "timeline").text
    )
    assert browser.execute_script("return window.groveNoReload;") == 42, "no reload"
    # Read in one script call: live follow may still be putting a fragment in place.
    ids = browser.execute_script(
        "return Array.from(document.querySelectorAll('#timeline li.item')).map(i => i.id);"
    )
    assert len(ids) == len(set(ids)), f"no item twice: {ids}"
    shot(browser, "workspace")
    assert console_errors(browser) == []


def test_another_user_cannot_open_the_workspace(grove: Grove, browser) -> None:
    sign_in(browser, grove, BOB)
    browser.get(f"{grove.base}/ui/workspaces/{grove.workspace}")
    assert browser.find_element(By.TAG_NAME, "h1").text == "404"
    assert "browser-output-1" not in browser.page_source
    browser.get(f"{grove.base}/ui/workspaces")
    assert grove.workspace[:8] not in browser.find_element(By.ID, "workspaces").text
    # The 404 itself is the one expected failed load.
    assert console_errors(browser, allow=("status of 404",)) == []


def test_workspaces_and_events_pages_render_for_an_operator(grove: Grove, browser) -> None:
    sign_in(browser, grove, OPS)
    browser.get(grove.base + "/ui/workspaces")
    assert grove.workspace[:8] in browser.find_element(By.ID, "workspaces").text
    assert browser.find_element(By.ID, "disk-chart").is_displayed()
    # The node's sweeps run every few seconds: the chart gets its water marks.
    deadline = time.time() + 20
    while not browser.find_elements(By.CSS_SELECTOR, "#disk-chart line.high"):
        assert time.time() < deadline, "no sweep reported water marks"
        time.sleep(1)
        browser.refresh()
    browser.find_element(By.ID, "search").send_keys("alice")
    browser.find_element(By.CSS_SELECTOR, "form.search button").click()
    navigating(browser, 10).until(ec.url_contains("q=alice"))
    assert grove.workspace[:8] in browser.find_element(By.ID, "workspaces").text
    shot(browser, "workspaces")
    browser.get(grove.base + "/ui/events")
    run = browser.find_element(By.ID, "run-verify")
    run.click()
    # The form's POST redirects to a new page: wait for it before reading the result.
    navigating(browser, 10).until(ec.staleness_of(run))
    deadline = time.time() + 30
    while "differences" not in browser.find_element(By.ID, "verify-result").text:
        assert time.time() < deadline, browser.find_element(By.ID, "verify-result").text
        time.sleep(0.5)
        browser.refresh()
    assert " 0 differences" in browser.find_element(By.ID, "verify-result").text
    assert "exec.finished" in browser.find_element(By.ID, "events").text
    shot(browser, "events")
    assert console_errors(browser) == []


def test_an_operator_opens_a_steps_diff_and_rewinds_after_confirming(grove: Grove, browser) -> None:
    grove.exec(ALICE, ["sh", "-c", "echo '<b>first</b>' > notes.txt"])
    grove.exec(ALICE, ["sh", "-c", "echo second >> notes.txt"])
    sign_in(browser, grove, OPS)
    page = f"{grove.base}/ui/workspaces/{grove.workspace}"
    browser.get(page)
    numbers = [
        int(p.get_attribute("id").removeprefix("point-"))
        for p in browser.find_elements(By.CSS_SELECTOR, "#timeline .point")
    ]
    last = max(numbers)
    before = last - 1
    assert before in numbers, numbers

    # The last step's diff: its file and its added line.
    browser.find_element(By.CSS_SELECTOR, f"#point-{last} a.diff-link").click()
    navigating(browser, 10).until(ec.presence_of_element_located((By.ID, "patch")))
    assert "notes.txt" in browser.find_element(By.ID, "diff-files").text
    assert "+second" in browser.find_element(By.ID, "patch").text
    shot(browser, "diff")

    # Rewind to the step before it: a confirmation first, then the new point.
    browser.get(page)
    browser.find_element(By.ID, f"rewind-{before}").click()
    navigating(browser, 10).until(ec.presence_of_element_located((By.ID, "confirm-rewind")))
    assert f"to point {before}" in browser.find_element(By.TAG_NAME, "h1").text
    content = grove.api(f"/v1/workspaces/{grove.workspace}/tools/read_file", ALICE,
                        {"path": "notes.txt"})["content"]
    assert content == "<b>first</b>\nsecond\n", "asking changed nothing"
    browser.find_element(By.ID, "confirm-rewind").click()
    navigating(browser, 20).until(ec.presence_of_element_located((By.ID, "new-point")))
    new = int(browser.find_element(By.ID, "new-point").text)
    assert new > last
    browser.find_element(By.ID, "back").click()
    navigating(browser, 10).until(ec.presence_of_element_located((By.ID, f"point-{new}")))
    item = browser.execute_script(
        "return document.getElementById(arguments[0]).parentElement.innerText;", f"point-{new}"
    )
    assert f"rewound to point {before}" in item, item
    assert "asked for by ops from the console" in item, item
    browser.execute_script(
        "document.getElementById(arguments[0]).scrollIntoView({block: 'end'});", f"point-{new}"
    )
    shot(browser, "history")
    content = grove.api(f"/v1/workspaces/{grove.workspace}/tools/read_file", ALICE,
                        {"path": "notes.txt"})["content"]
    assert content == "<b>first</b>\n"
    assert console_errors(browser) == []
