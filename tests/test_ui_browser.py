"""The viewer in a real headless Chromium (Debian's ``chromium``, driven by Playwright from
PyPI; no browser is downloaded): on a folder trained in the test, every page draws what the
folder recorded, with no console error, and updates while training goes on.

Screenshots of each page go to ``$ART_UI_SCREENSHOTS`` when set (the README's images come
from there), else to the test's temporary folder.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from browser_support import chromium, expect, record_page_errors
from ui_support import GROUP_SIZE, PROMPTS, ViewerServer, train_steps

import art_core as art
from art_core.model_folder import ModelFolder
from art_core.testing.pytest_plugin import register_tiny_model

# run.sh installs it in the background while other tests run
pytestmark = pytest.mark.needs_install("chromium")

TIMEOUT_MS = 60_000


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def browser() -> AsyncIterator[Any]:
    async with chromium() as launched:
        yield launched


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def agent(backend: art.LocalBackend) -> art.TrainableModel:
    model = await register_tiny_model(backend, "browser-agent", "ui-browser")
    await train_steps(model, 2)
    return model


@pytest.fixture(scope="module")
def folder(agent: art.TrainableModel, art_path: Path) -> ModelFolder:
    return ModelFolder.of(art_path, "ui-browser", "browser-agent")


@pytest.fixture(scope="module")
def viewer(agent: art.TrainableModel, art_path: Path):  # type: ignore[no-untyped-def]
    with ViewerServer(art_path) as server:
        yield server


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    target = Path(os.environ.get("ART_UI_SCREENSHOTS") or tmp_path)
    target.mkdir(parents=True, exist_ok=True)
    return target


class Page:
    """A browser tab that records console errors and uncaught exceptions."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.errors: list[str] = []
        record_page_errors(page, self.errors)
        page.set_default_timeout(TIMEOUT_MS)


@pytest_asyncio.fixture(loop_scope="session")
async def tab(browser: Any) -> AsyncIterator[Page]:
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    yield Page(await context.new_page())
    await context.close()


async def test_run_page_draws_every_point_and_grows_while_training(
    tab: Page, viewer: ViewerServer, agent: art.TrainableModel, folder: ModelFolder, shots: Path
) -> None:
    page = tab.page
    await page.goto(f"{viewer.url}/run/ui-browser/browser-agent")
    points = '[data-curve="reward"] circle.point[data-series="train"]'
    await page.wait_for_selector(points)
    train = [r for r in folder.read_history() if r["split"] == "train"]
    assert await page.locator(points).count() == len(train)
    steps = [
        float(s)
        for s in await page.locator(points).evaluate_all("ps => ps.map(p => p.dataset.step)")
    ]
    assert steps == [r["step"] for r in train]
    values = await page.locator(points).evaluate_all("ps => ps.map(p => Number(p.dataset.value))")
    assert values == pytest.approx([r["train/reward"] for r in train])
    assert (
        await page.locator('[data-curve="reward"] circle.point[data-series="validation"]').count()
        == 1
    )
    assert await page.locator('[data-curve="loss"] svg').count() == 1
    await page.screenshot(path=str(shots / "ui-run.png"))

    # One more step while the page is open: its point appears without a reload.
    await train_steps(agent, 1)
    # (Playwright's locator waits: the page's CSP forbids the eval of wait_for_function.)
    await expect(page.locator(points)).to_have_count(len(train) + 1, timeout=TIMEOUT_MS)
    await page.wait_for_selector(f'[data-split="train"] a.step-link >> text="{len(train)}"')
    assert tab.errors == []


async def test_step_table_sorts_and_filters(
    tab: Page, viewer: ViewerServer, folder: ModelFolder, shots: Path
) -> None:
    page = tab.page
    await page.goto(f"{viewer.url}/step/ui-browser/browser-agent/train/1")
    await page.wait_for_selector("#rollouts tbody tr")
    rows = page.locator("#rollouts tbody tr")
    assert await rows.count() == len(PROMPTS) * GROUP_SIZE

    async def column(key: str) -> list[float]:
        cells = page.locator(f'#rollouts tbody td[data-key="{key}"]')
        return [float(t) for t in await cells.all_inner_texts()]

    async def sort_by(key: str, direction: str) -> None:
        await page.click(f'#rollouts th[data-key="{key}"]')
        header = page.locator(f'#rollouts th[data-key="{key}"]')
        await expect(header).to_have_attribute("data-sort", direction)

    await sort_by("reward", "asc")
    ascending = await column("reward")
    assert ascending == sorted(ascending)
    await sort_by("reward", "desc")
    descending = await column("reward")
    assert descending == sorted(ascending, reverse=True)
    await sort_by("completion_tokens", "asc")
    tokens = await column("completion_tokens")
    assert tokens == sorted(tokens)
    recorded = sorted(t.reward for g in folder.read_trajectories("train", 1) for t in g)
    assert sorted(ascending) == recorded

    await page.select_option("#group-filter", "1")
    await expect(rows).to_have_count(GROUP_SIZE)
    await page.select_option("#group-filter", "")
    await expect(rows).to_have_count(len(PROMPTS) * GROUP_SIZE)
    await page.fill("#filter", "Lima")
    await expect(rows).to_have_count(GROUP_SIZE)
    await expect(page.locator("#row-count")).to_have_text(f"rows 1–{GROUP_SIZE} of {GROUP_SIZE}")
    await page.fill("#filter", "")
    await expect(rows).to_have_count(len(PROMPTS) * GROUP_SIZE)
    await page.screenshot(path=str(shots / "ui-step.png"))

    await page.click("#groups a.show-group >> nth=0")
    await page.wait_for_selector("#side-by-side .side > div")
    assert await page.locator("#side-by-side .side > div").count() == GROUP_SIZE
    assert tab.errors == []


async def test_rollout_shows_tool_calls_and_the_advantage_sign_of_each_token(
    tab: Page, viewer: ViewerServer, folder: ModelFolder, shots: Path
) -> None:
    signal = folder.read_training_signal("train", 1)
    trajectory = next(t for g in folder.read_trajectories("train", 1) for t in g if t.id in signal)
    page = tab.page
    await page.goto(f"{viewer.url}/rollout/ui-browser/browser-agent/train/1/{trajectory.id}")
    await page.wait_for_selector("#token-view .tok")

    first, second = sorted(trajectory.calls, key=lambda c: c.index)
    [tool_call] = first.response_message["tool_calls"]
    shown = page.locator(f'.toolcall[data-tool="{tool_call["function"]["name"]}"] .args')
    assert await shown.inner_text() == tool_call["function"]["arguments"]
    assert json.loads(await shown.inner_text()) == json.loads(tool_call["function"]["arguments"])
    node = page.locator('.msg[data-role="assistant"] .framework[data-key="langgraph_node"]')
    assert await node.inner_text() == "langgraph_node: agent"
    tool = page.locator('.msg[data-role="tool"] pre')
    assert await tool.inner_text() == second.messages[-1]["content"]

    trained = page.locator("#token-view .tok.trained")
    ids = [int(i) for i in await trained.evaluate_all("ts => ts.map(t => t.dataset.id)")]
    assert ids == first.completion_token_ids + second.completion_token_ids
    advantage = signal[trajectory.id]["advantage"]
    signs = set(await trained.evaluate_all("ts => ts.map(t => t.dataset.advantageSign)"))
    assert signs == {str(int(math.copysign(1, advantage)))}
    ratios = [float(r) for r in await trained.evaluate_all("ts => ts.map(t => t.dataset.ratio)")]
    recorded = signal[trajectory.id]["sequences"][0]["trainer_logprobs"]
    sampler = first.logprobs + second.logprobs
    assert ratios == pytest.approx(
        [math.exp(t - s) for t, s in zip(recorded, sampler, strict=True)], abs=1e-3
    )
    assert float(await page.locator("#advantage").inner_text()) == pytest.approx(
        advantage, abs=1e-3
    )

    await trained.nth(0).hover()
    tip = await page.locator("#tip").inner_text()
    assert "importance ratio" in tip and f"adapter step {first.adapter_step}" in tip
    await page.locator("#token-view").scroll_into_view_if_needed()
    await page.screenshot(path=str(shots / "ui-rollout.png"), full_page=True)
    assert tab.errors == []


async def test_compare_puts_one_scenario_at_two_steps_side_by_side(
    tab: Page, viewer: ViewerServer, shots: Path
) -> None:
    page = tab.page
    await page.goto(f"{viewer.url}/run/ui-browser/browser-agent")
    await page.wait_for_selector("#compare-go")
    await page.click("#compare-go")
    await page.wait_for_selector("#compare-b-view .msg")
    assert await page.locator("#scenarios tbody tr").count() == len(PROMPTS)
    assert await page.locator("#compare-a-view .toolcall").count() >= 1
    assert await page.locator("#compare-b-view .toolcall").count() >= 1
    await page.click("#scenarios a.scenario >> nth=1")
    await expect(page.locator("#compare-a-view")).to_contain_text("Lima")
    await page.screenshot(path=str(shots / "ui-compare.png"))
    # Any two models' steps: here a step against a model that does not exist, then fixed.
    await page.fill("#compare-input-b", "ui-browser/nobody/train/0")
    await page.click("#compare-submit")
    await expect(page.locator(".problem")).to_contain_text("no model ui-browser/nobody")
    await page.fill("#compare-input-b", "ui-browser/browser-agent/val/2")
    await page.click("#compare-submit")
    await expect(page.locator("#scenarios tbody tr")).to_have_count(len(PROMPTS))
    # The refused comparison logs its 404; nothing else.
    assert [e for e in tab.errors if "404" not in e] == []


async def test_damaged_folder_shows_its_message(
    tab: Page, folder: ModelFolder, tmp_path: Path
) -> None:
    copy = ModelFolder(tmp_path / "art" / "ui-browser" / "models" / "browser-agent")
    shutil.copytree(folder.root, copy.root, ignore=shutil.ignore_patterns("checkpoints"))
    copy.model_json.write_text("{broken", encoding="utf-8")
    copy.trajectories("train", 0).write_text("not a group\n", encoding="utf-8")
    with ViewerServer(tmp_path / "art") as server:
        page = tab.page
        await page.goto(server.url + "/")
        await page.wait_for_selector("#runs td")
        assert "model.json is not JSON" in await page.locator("#runs").inner_text()
        await page.goto(f"{server.url}/step/ui-browser/browser-agent/train/0")
        await page.wait_for_selector(".problem")
        assert "line 1 is not a trajectory group" in await page.locator(".problem").inner_text()
        await page.goto(f"{server.url}/step/ui-browser/browser-agent/train/77")
        await page.wait_for_selector("#page-error")
        assert "no trajectories file train/0077.jsonl" in await page.inner_text("#page-error")
        await page.goto(f"{server.url}/run/nobody/here")
        await page.wait_for_selector("#page-error")
        assert "no model nobody/here" in await page.inner_text("#page-error")
    # The refused fetches log their 404s; nothing threw.
    assert not [e for e in tab.errors if e.startswith("uncaught")]


async def test_hostile_record_is_shown_as_text(
    tab: Page, folder: ModelFolder, tmp_path: Path
) -> None:
    """A model may write anything: markup in a reply, a tool name or a tool result is shown as
    text, never run."""
    copy = ModelFolder(tmp_path / "art" / "ui-browser" / "models" / "browser-agent")
    shutil.copytree(folder.root, copy.root, ignore=shutil.ignore_patterns("checkpoints"))
    lines = copy.trajectories("train", 0).read_text(encoding="utf-8").splitlines()
    group = json.loads(lines[0])
    trajectory = group["trajectories"][0]
    first, second = sorted(trajectory["calls"], key=lambda c: c["index"])
    markup = '<img src=x onerror="document.title=1"><script>document.title="pwned"</script>'
    first["response_message"]["tool_calls"][0]["function"]["name"] = f'"><b>{markup}'
    second["messages"][-1]["content"] = markup
    second["response_message"] = {"role": "assistant", "content": markup}
    trajectory["metadata"]["task"] = markup
    lines[0] = json.dumps(group)
    copy.trajectories("train", 0).write_text("\n".join(lines) + "\n", encoding="utf-8")
    with ViewerServer(tmp_path / "art") as server:
        page = tab.page
        await page.goto(f"{server.url}/rollout/ui-browser/browser-agent/train/0/{trajectory['id']}")
        await page.wait_for_selector(".msg")
        await page.wait_for_selector("#token-view")
        assert await page.locator("main img, main script").count() == 0
        shown_name = await page.locator(".toolcall > b").first.inner_text()
        assert shown_name == f'"><b>{markup}'
        texts = await page.locator('.msg[data-role="tool"] pre').all_inner_texts()
        assert texts == [markup]
        await page.goto(f"{server.url}/step/ui-browser/browser-agent/train/0")
        await page.wait_for_selector("#rollouts tbody tr")
        assert await page.locator("main img, main script").count() == 0
        assert markup in await page.locator("#rollouts").inner_text()
        assert await page.title() == "art-core ui"
    assert not [e for e in tab.errors if e.startswith("uncaught")]


async def test_run_page_shows_why_and_the_evaluations(
    tab: Page, folder: ModelFolder, tmp_path: Path, shots: Path
) -> None:
    """A step's diagnoses (with the setting to change) and an evaluation with its intervals,
    drawn from the history as text."""
    copy = ModelFolder(tmp_path / "art" / "ui-browser" / "models" / "browser-agent")
    shutil.copytree(folder.root, copy.root, ignore=shutil.ignore_patterns("checkpoints"))
    markup = "<img src=x onerror=\"document.title='pwned'\">"
    diagnosis = {
        "code": "truncated",
        "finding": f"8 of 8 runs had a response cut by max_tokens (2) {markup}",
        "setting": "raise max_tokens (art_mcp: RolloutSettings(max_tokens=...), --max-tokens)",
        "share": 1.0,
        "threshold": 0.2,
        "unit": "rollouts",
    }
    evaluation = {
        "split": "eval",
        "step": 2,
        "eval_split": "test",
        "eval_label": "best",
        "tasks": 20,
        "runs": 80,
        "eval/mean_reward": 0.41,
        "eval/mean_reward_low": 0.3,
        "eval/mean_reward_high": 0.53,
    }
    with copy.history.open("a", encoding="utf-8") as file:
        file.write(json.dumps({"step": 3, "split": "diagnoses", "diagnoses": [diagnosis]}) + "\n")
        file.write(json.dumps(evaluation) + "\n")
    with ViewerServer(tmp_path / "art") as server:
        page = tab.page
        await page.goto(f"{server.url}/run/ui-browser/browser-agent")
        item = page.locator('#diagnoses [data-step="3"] li[data-code="truncated"]')
        await item.wait_for()
        text = await item.inner_text()
        assert diagnosis["finding"] in text and "--max-tokens" in text
        assert "(100% of rollouts; fires at 20%)" in text
        cells = await page.locator("#evals tbody tr").first.locator("td").all_inner_texts()
        assert cells[:6] == ["2", "best", "test", "20", "80", "0.41 [0.3, 0.53]"]
        assert await page.locator("main img").count() == 0
        assert await page.title() == "art-core ui"
        await page.screenshot(path=str(shots / "ui-run-findings.png"), full_page=True)
    assert tab.errors == []
