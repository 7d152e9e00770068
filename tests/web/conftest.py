"""Browser fixtures: Debian's Chromium driven by Playwright, fresh profile per test.

Playwright's own browser download cannot work here, so the tests use the
system ``chromium`` (``apt-get install -y chromium``) through
``executable_path``.  Without it (or without the ``playwright`` package) the
tests skip, which the root conftest turns into failures under ``CI=true``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--autoplay-policy=no-user-gesture-required",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "web"


def chromium_path() -> str | None:
    found = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    return found if os.path.exists(found) else None


@pytest.fixture(scope="session")
def playwright_driver() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    if chromium_path() is None:
        pytest.skip("Debian's chromium is missing: apt-get update && apt-get install -y chromium")
    with sync_api.sync_playwright() as driver:
        yield driver


@dataclass
class BrowserPage:
    page: Any
    console_errors: list[str] = field(default_factory=list)

    def stats(self) -> dict[str, Any]:
        """The worklet's last report (samples at the AudioContext rate)."""
        return self.page.evaluate(
            "(() => ({...demo.player.stats, rate: demo.player.sampleRate, heard: undefined}))()"
        )

    def events(self, kind: str) -> list[dict[str, Any]]:
        return self.page.evaluate("(kind) => demo.log.filter((e) => e.type === kind)", kind)


@pytest.fixture
def browser(playwright_driver: Any) -> Iterator[Any]:
    """A Chromium with a fresh user-data dir, closed after the test."""
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    context = playwright_driver.chromium.launch_persistent_context(
        profile,
        executable_path=chromium_path(),
        headless=True,
        args=CHROMIUM_ARGS,
        viewport={"width": 1280, "height": 760},
    )
    try:
        yield context
    finally:
        context.close()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def open_demo(browser: Any) -> Any:
    """Open the demo page of a server, wait until it is configured."""

    def open_(http_url: str, query: str = "") -> BrowserPage:
        page = browser.new_page()
        opened = BrowserPage(page)
        page.on(
            "console",
            lambda m: m.type in ("error", "warning") and opened.console_errors.append(m.text),
        )
        page.on("pageerror", lambda e: opened.console_errors.append(f"uncaught: {e}"))
        page.goto(f"{http_url}/{query}")
        page.wait_for_function(
            "window.demo && window.demo.ready && demo.client.config", timeout=20_000
        )
        return opened

    return open_


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS
