"""The documentation site (mkdocs.yml, docs/): ``mkdocs build --strict`` passes, so a broken
link, anchor or cross-reference, a docstring griffe cannot read, or a command or public name
the generated reference cannot render (docs/gen_reference.py) fails CI; then the built site,
served from loopback, works offline in a real headless Chromium (Debian's ``chromium``,
driven by Playwright from PyPI, as tests/browser_support.py does): the start page draws,
search finds the API reference and leads to it, with no console error, no failed request and
no request leaving loopback.

A screenshot of the start page goes to ``$ART_DOCS_SCREENSHOT`` when set.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from browser_support import chromium, expect, record_page_errors
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from art_core.testing.loopback import LoopbackServer

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_MS = 30_000


def _need_mkdocs() -> None:
    """Skips (fails under CI) without the docs packages of the dev extra."""
    try:
        import mkdocs  # noqa: F401
        import mkdocs_gen_files  # noqa: F401
        import mkdocstrings_handlers.python  # noqa: F401
    except ImportError as error:
        reason = f"the docs packages are not installed (pip install -e '.[dev]'): {error}"
        if os.environ.get("CI"):
            pytest.fail(f"CI must build the documentation site: {reason}")
        pytest.skip(reason)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once with ``mkdocs build --strict`` (any warning fails the build)."""
    _need_mkdocs()
    out = tmp_path_factory.mktemp("site")
    # MkDocs' plugins print a banner about MkDocs 2 on every run; these two keep it quiet.
    env = {**os.environ, "DISABLE_MKDOCS_2_WARNING": "true", "NO_MKDOCS_2_WARNING": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--clean"]
    command += ["-f", str(ROOT / "mkdocs.yml"), "-d", str(out)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stderr[-6000:]}"
    return out


def test_build_is_strict_and_the_reference_covers_every_public_name(site: Path) -> None:
    cli = (site / "reference/cli/index.html").read_text()
    # Every subcommand, the integrations' through their entry points, with its own help.
    for command in ("art-core", "art-core serve", "art-core engines install", "art-core mcp"):
        anchor = command.replace(" ", "-")
        assert f'id="{anchor}"' in cli, command
    assert "art-core verifiers install" in cli
    assert "--base-model" in cli  # an option's help, not only the command list

    # Each package's page renders every name of its __all__ (as rendered by griffe: a
    # heading whose id ends with the name).
    for init in [ROOT / "art_core/__init__.py", *ROOT.glob("integrations/*/art_*/__init__.py")]:
        package = init.parent.name
        page = (site / "reference/python" / package / "index.html").read_text()
        names = re.search(r"__all__ = \[(.*?)\]", init.read_text(), re.S)
        assert names, f"{init} has no __all__"
        for name in re.findall(r'"(\w+)"', names.group(1)):
            assert re.search(rf'id="{package}(\.\w+)*\.{name}"', page), f"{package}.{name}"


class SiteServer(LoopbackServer):
    """The built site as static files (a folder's ``index.html`` for its URL, as
    ``use_directory_urls`` pages need)."""

    def __init__(self, site: Path) -> None:
        super().__init__()
        self.site = site

    def app(self) -> ASGIApp:
        return Starlette(routes=[Mount("/", StaticFiles(directory=self.site, html=True))])


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    """The built site on a loopback HTTP server (an ephemeral port); its base URL."""
    with SiteServer(site) as server:
        yield server.url


@pytest.mark.needs_install("chromium")  # run.sh installs it in the background under CI
async def test_site_works_offline_and_search_finds_the_api(served: str) -> None:
    problems: list[str] = []  # console errors, failed requests, requests off loopback
    async with chromium() as browser:
        context = await browser.new_context(viewport={"width": 1280, "height": 900})

        async def loopback_only(route: Any) -> None:
            if urlsplit(route.request.url).hostname == "127.0.0.1":
                await route.continue_()
            else:
                problems.append(f"left loopback: {route.request.url}")
                await route.abort()

        await context.route("**/*", loopback_only)
        page = await context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        record_page_errors(page, problems)
        page.on("requestfailed", lambda r: problems.append(f"failed: {r.url} {r.failure}"))
        page.on(
            "response", lambda r: problems.append(f"{r.status}: {r.url}") if r.ok is False else None
        )

        await page.goto(f"{served}/", wait_until="load")
        assert "art-core" in await page.title()
        await expect(page.locator("article h1").first).to_be_visible()
        await expect(page.locator("nav.md-nav--primary")).to_contain_text("Python API")
        if shot := os.environ.get("ART_DOCS_SCREENSHOT"):
            Path(shot).parent.mkdir(parents=True, exist_ok=True)
            await page.screenshot(path=shot)

        # Search (its index loads in a web worker) finds a class of the API reference.
        search = page.locator("input[data-md-component=search-query]")
        await search.click()
        await search.press_sequentially("TrainableModel")
        result = page.locator("a.md-search-result__link[href*='reference/python/art_core/']")
        await expect(result.first).to_be_visible()
        await result.first.click()
        await page.wait_for_url(re.compile(r"/reference/python/art_core/"))
        await expect(page.locator('[id="art_core.TrainableModel"]')).to_be_visible()
        await context.close()
    assert problems == []
