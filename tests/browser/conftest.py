"""The review page in a real headless browser: Debian's chromium driven through its chromedriver by Selenium (which
downloads nothing: both paths are given), against ``pagescribe serve`` run as a user runs it — its HTTP bridge, its
moto server, the machine's PostgreSQL (a database of this module's own) and the fake provider over HTTP."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.wait import WebDriverWait

from tests.fakes.chat_server import Behaviour, FakeChatServer
from tests.support.commands import command_environment
from tests.support.database import fresh_database

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
API_KEY = "review-key-0123456789"
MODEL = "test/vision-model"
OTHER_MODEL = "test/other-vision-model"
WAIT_SECONDS = 180  # a loaded two-core machine: the pipeline and the browser share it
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)


class Answers:
    """What the fake provider answers for a page image (by its SHA-256) and a model; other requests get its default."""

    def __init__(self) -> None:
        self._table: dict[tuple[str, str], Behaviour] = {}

    def set(self, image: bytes, model: str, behaviour: Behaviour) -> None:
        self._table[hashlib.sha256(image).hexdigest(), model] = behaviour

    def __call__(self, body: dict[str, Any], image: bytes) -> Behaviour | None:
        return self._table.get((hashlib.sha256(image).hexdigest(), str(body.get("model"))))


@dataclass(frozen=True)
class Stack:
    api: str
    answers: Answers
    log: Path  # pagescribe serve's stderr, to read when a test fails


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """``pagescribe serve`` with an API key and a second model allowed, on a database of its own (no transcript of
    another module's to reuse), and the fake provider it calls."""
    answers = Answers()
    where = tmp_path_factory.mktemp("serve")
    with fresh_database() as database_url, FakeChatServer() as provider:
        provider.route(answers)
        env = {
            **command_environment(database_url, provider),
            "API_KEY": API_KEY,
            "ALLOWED_MODELS": f"{MODEL},{OTHER_MODEL}",
            "POWERTOOLS_LOG_LEVEL": "WARNING",
        }
        log = where / "serve.log"
        with log.open("w") as stderr:
            server = subprocess.Popen(
                [sys.executable, "-m", "pagescribe_local.cli", "serve", "--port", "0"],
                env=env,
                cwd=where,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
            try:
                assert server.stdout is not None
                line = server.stdout.readline()
                assert line, f"pagescribe serve did not start: {log.read_text()[-3000:]}"
                # The handlers' JSON logs follow on stdout: drained into a file, since a full pipe would stop
                # whichever process writes to it next (the Lambda service's poller, an API environment)
                drain = threading.Thread(target=_copy, args=(server.stdout, where / "serve.stdout.log"), daemon=True)
                drain.start()
                yield Stack(json.loads(line)["api"], answers, log)
            finally:
                server.send_signal(signal.SIGINT)
                try:
                    server.wait(timeout=60)
                finally:
                    server.kill()  # no server outlives its tests, even one that did not stop on Ctrl-C


def _copy(stream: IO[str], path: Path) -> None:
    with path.open("w") as copy:
        for line in stream:
            copy.write(line)


class Page:
    """The browser on the review page, and what the tests ask of it."""

    def __init__(self, driver: WebDriver, downloads: Path) -> None:
        self.driver = driver
        self.downloads = downloads

    def until(self, condition: Callable[[WebDriver], Any], message: str = "") -> Any:
        return WebDriverWait(self.driver, WAIT_SECONDS, poll_frequency=0.2).until(condition, message)

    def find(self, css: str) -> WebElement:
        return self.driver.find_element(By.CSS_SELECTOR, css)

    def all(self, css: str) -> list[WebElement]:
        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def script(self, source: str, *args: Any) -> Any:
        return self.driver.execute_script(source, *args)

    def viewport(self, width: int, height: int) -> None:
        """The page's layout viewport, as a device of that size shows it."""
        self.driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 600},
        )

    def sign_in(self, api: str, key: str = API_KEY) -> None:
        """A fresh tab session on the review page, signed in with ``key``."""
        self.driver.get(f"{api}/review")
        self.script("sessionStorage.clear()")
        self.driver.get(f"{api}/review")
        self.until(lambda d: self.find("#api-key").is_displayed(), "the key field is shown")
        self.find("#api-key").send_keys(key)
        self.find("#login-form button[type=submit]").click()
        self.until(lambda d: self.find("#home").is_displayed(), "the home view is shown once signed in")

    def drop(self, path: Path) -> WebElement:
        """The file given to the drop zone's file input; its upload row."""
        before = len(self.all("#uploads li"))
        self.find("#file-input").send_keys(str(path))
        self.until(lambda d: len(self.all("#uploads li")) > before, "an upload row appears")
        return self.all("#uploads li")[0]

    def open_first_page(self, link: WebElement) -> None:
        """Follow a document's link and wait until its page 1 is shown."""
        link.click()
        self.until(lambda d: self.all("#page-view[data-page]") and self.shown_page() == 1, "page 1 is shown")

    def finished(self, row: WebElement) -> str:
        """Wait for an upload row to reach a final status; that status."""
        self.until(
            lambda d: row.get_attribute("data-status") in {"COMPLETED", "PARTIAL", "FAILED", "ERROR"},
            "the upload finishes",
        )
        return str(row.get_attribute("data-status"))

    def policy_violations(self) -> list[str]:
        """What the console reported the Content-Security-Policy refused since it was last read."""
        entries = self.driver.execute("getLog", {"type": "browser"})["value"]  # get_log, which is untyped
        return [str(e["message"]) for e in entries if "Content Security Policy" in e["message"]]

    def shown_page(self) -> int:
        return int(self.find("#page-view").get_attribute("data-page") or 0)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Page]:
    options = Options()
    options.binary_location = str(CHROMIUM)
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    options.add_argument("--window-size=1280,900")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the console: Content-Security-Policy reports
    downloads = tmp_path_factory.mktemp("downloads")
    options.add_experimental_option(
        "prefs", {"download.default_directory": str(downloads), "download.prompt_for_download": False}
    )
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield Page(driver, downloads)
    finally:
        driver.quit()


@pytest.fixture
def page(browser: Page) -> Page:
    """The browser at 1280 px wide, as a desktop shows the page."""
    browser.viewport(1280, 900)
    return browser
