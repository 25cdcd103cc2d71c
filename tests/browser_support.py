"""A real headless Chromium for the browser tests: Debian's ``chromium``, driven by Playwright
from PyPI (a browser is never downloaded). Under CI a missing browser fails the test."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("ART_CHROMIUM", "/usr/bin/chromium")
# What the machine's closed network needs (no background connections), and root's sandbox.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


def need_browser() -> Any:
    """Playwright's ``async_playwright``; skips (fails under CI) when it or Chromium is missing."""
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        reason = "playwright is not installed (pip install -e '.[dev]')"
    else:
        if Path(CHROMIUM).is_file():
            return async_playwright
        reason = f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the browser tests: {reason}")
    pytest.skip(reason)


@asynccontextmanager
async def chromium() -> AsyncIterator[Any]:
    """A launched headless Chromium (Playwright ``Browser``)."""
    async_playwright = need_browser()
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            await browser.close()


def record_page_errors(page: Any, errors: list[str]) -> None:
    """Append the console errors and uncaught exceptions of ``page`` to ``errors`` as they
    happen (a test asserts the list stays empty)."""
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))


def expect(locator: Any) -> Any:
    """Playwright's ``expect`` (imported when a test uses it: Playwright may be missing)."""
    from playwright.async_api import expect as playwright_expect

    return playwright_expect(locator)
