"""The viewer's routes over a folder trained for real (tiny-random agents calling a tool),
over real HTTP: what each page's data says is what the folder recorded, nothing is written,
and damaged or hostile inputs get a message naming what is wrong."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from remote_support import ServerProcess
from ui_support import GROUP_SIZE, PROMPTS, ViewerServer, start_ui, stop_ui, train_steps

import art_core as art
from art_core.diagnoses import diagnose
from art_core.model_folder import ModelFolder
from art_core.testing.pytest_plugin import register_tiny_model
from art_core.training.advantages import group_advantages
from art_core.training.sequences import assemble_sequences
from art_core.trajectories import LLMCall
from art_core.ui import BrowserTokenAuth

TRAIN_STEPS = 2


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def trained(backend: art.LocalBackend, art_path: Path) -> ModelFolder:
    model = await register_tiny_model(backend, "ui-agent", "ui")
    await train_steps(model, TRAIN_STEPS)
    return ModelFolder.of(art_path, "ui", "ui-agent")


@pytest.fixture(scope="module")
def viewer(trained: ModelFolder, art_path: Path):  # type: ignore[no-untyped-def]
    with ViewerServer(art_path) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


def files_of(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_runs_and_curves(viewer: httpx.Client, trained: ModelFolder) -> None:
    runs = viewer.get("/api/runs").json()["runs"]
    [run] = [r for r in runs if (r["project"], r["name"]) == ("ui", "ui-agent")]
    assert run["checkpoint_step"] == TRAIN_STEPS and run["base_model"] == "tiny-random"
    assert run["problems"] == []

    page = viewer.get("/api/runs/ui/ui-agent").json()
    history = trained.read_history()
    reward = next(c for c in page["curves"] if c["id"] == "reward")
    series = {s["label"]: s["points"] for s in reward["series"]}
    train = [r for r in history if r["split"] == "train"]
    assert [p[:2] for p in series["train"]] == [[r["step"], r["train/reward"]] for r in train]
    assert [p[2] for p in series["train"]] == [r["train/reward_std"] for r in train]
    assert [p[0] for p in series["validation"]] == [TRAIN_STEPS]
    assert {"loss", "grad_norm", "entropy", "seconds"} <= {c["id"] for c in page["curves"]}
    assert page["steps"] == {"train": list(range(TRAIN_STEPS)), "val": [TRAIN_STEPS]}
    # Live updates: an unchanged history answers 204, nothing to redraw.
    unchanged = viewer.get("/api/runs/ui/ui-agent", params={"known": page["history_size"]})
    assert unchanged.status_code == 204

    csv = viewer.get("/api/runs/ui/ui-agent/curve.csv", params={"id": "reward"})
    assert csv.headers["content-type"].startswith("text/csv")
    lines = csv.text.strip().splitlines()
    assert lines[0] == "step,train,train band,validation"
    assert len(lines) == 1 + TRAIN_STEPS + 1
    picked = viewer.get("/api/runs/ui/ui-agent/curve.json", params={"metric": "train/loss"})
    assert [p[1] for p in picked.json()["series"][0]["points"]] == [r["train/loss"] for r in train]


def test_step_table_holds_every_rollout_with_its_advantage(
    viewer: httpx.Client, trained: ModelFolder
) -> None:
    page = viewer.get("/api/runs/ui/ui-agent/steps/train/1").json()
    groups = trained.read_trajectories("train", 1)
    assert len(page["rows"]) == len(PROMPTS) * GROUP_SIZE and page["problems"] == []
    assert page["signal_recorded"]
    for number, group in enumerate(groups):
        rows = [r for r in page["rows"] if r["group"] == number]
        assert [r["id"] for r in rows] == [t.id for t in group.trajectories]
        assert [r["reward"] for r in rows] == [t.reward for t in group.trajectories]
        assert all(r["turns"] == 2 and r["tool_calls"] == 1 for r in rows)
        advantages = group_advantages([t.reward for t in group.trajectories])
        if advantages is None:
            assert all(r["advantage"] is None for r in rows)
        else:
            assert [r["advantage"] for r in rows] == pytest.approx(advantages)
    assert [g["scenario"] for g in page["groups"]] == PROMPTS
    assert [g["ids"] for g in page["groups"]] == [[t.id for t in g] for g in groups]


def test_step_table_is_filtered_sorted_and_paged_by_the_server(viewer: httpx.Client) -> None:
    url = "/api/runs/ui/ui-agent/steps/train/1"
    everything = viewer.get(url).json()
    assert everything["total"] == everything["rollouts"] == len(PROMPTS) * GROUP_SIZE
    by_reward = viewer.get(url, params={"sort": "reward", "desc": "1"}).json()["rows"]
    rewards = [r["reward"] for r in by_reward]
    assert rewards == sorted(rewards, reverse=True)
    pages = [
        viewer.get(url, params={"sort": "reward", "desc": "1", "offset": o, "limit": 3}).json()
        for o in (0, 3, 6)
    ]
    assert [len(p["rows"]) for p in pages] == [3, 3, len(PROMPTS) * GROUP_SIZE - 6]
    assert [r["id"] for p in pages for r in p["rows"]] == [r["id"] for r in by_reward]
    lima = viewer.get(url, params={"q": "LIMA"}).json()
    assert lima["total"] == GROUP_SIZE and {r["group"] for r in lima["rows"]} == {1}
    assert viewer.get(url, params={"group": "0"}).json()["total"] == GROUP_SIZE
    for params, message in (
        ({"sort": "__class__"}, "sort must be one of"),
        ({"limit": "0"}, "limit must be between 1 and 1000"),
        ({"limit": "5000"}, "limit must be between 1 and 1000"),
        ({"offset": "-1"}, "offset must be between"),
        ({"offset": "x"}, "offset must be a whole number"),
        ({"q": "x" * 201}, "q is longer than 200"),
    ):
        refused = viewer.get(url, params=params)
        assert refused.status_code == 400 and message in refused.json()["error"]["message"], params


def test_rollout_shows_exact_tool_calls_and_trained_tokens(
    viewer: httpx.Client, trained: ModelFolder
) -> None:
    groups = trained.read_trajectories("train", 1)
    signal = trained.read_training_signal("train", 1)
    trajectory = next(t for g in groups for t in g.trajectories if t.id in signal)
    page = viewer.get(f"/api/runs/ui/ui-agent/steps/train/1/rollouts/{trajectory.id}").json()

    first, second = sorted(trajectory.calls, key=lambda c: c.index)
    [tool_call] = first.response_message["tool_calls"]
    assistant = [m for m in page["messages"] if m["role"] == "assistant"]
    assert assistant[0]["tool_calls"] == [
        {
            "id": tool_call["id"],
            "name": tool_call["function"]["name"],
            "arguments": tool_call["function"]["arguments"],
        }
    ]
    assert assistant[0]["framework"] == {"langgraph_node": "agent"}
    assert assistant[1]["framework"] == {}
    [tool] = [m for m in page["messages"] if m["role"] == "tool"]
    assert tool["content"] == second.messages[-1]["content"]
    assert [m["kind"] for m in page["messages"]].count("branch") == 0

    tokens = page["tokens"]
    assert tokens["available"] and tokens["trained"]
    assert tokens["advantage"] == signal[trajectory.id]["advantage"] != 0
    [sequence] = tokens["sequences"]
    trained_tokens = [
        t for s in sequence["segments"] if s["kind"] == "trained" for t in s["tokens"]
    ]
    # The trained tokens are exactly the sampled ones, in order, with their sampler.
    assert [
        t[0] for t in trained_tokens
    ] == first.completion_token_ids + second.completion_token_ids
    assert [t[2] for t in trained_tokens] == pytest.approx(
        first.logprobs + second.logprobs, abs=1e-5
    )
    assert {t[3] for t in trained_tokens} == {first.adapter_step}
    recorded = signal[trajectory.id]["sequences"][0]["trainer_logprobs"]
    assert [t[4] for t in trained_tokens] == recorded
    ratios = [math.exp(t[4] - t[2]) for t in trained_tokens]
    assert all(0.5 < r < 2.0 for r in ratios)
    assembled = assemble_sequences([LLMCall.model_validate(c) for c in (first, second)])
    context = sum(s["tokens"] for s in sequence["segments"] if s["kind"] == "context")
    assert context + len(trained_tokens) == len(assembled.sequences[0].token_ids)
    assert tokens["tokenizer"].endswith("tokenizer.json")
    assert all(isinstance(t[1], str) and t[1] for t in trained_tokens)


def test_compare_matches_scenarios_across_steps(viewer: httpx.Client, trained: ModelFolder) -> None:
    data = viewer.get(
        "/api/compare", params={"a": "ui/ui-agent/train/0", "b": "ui/ui-agent/train/1"}
    ).json()
    assert [s["scenario"] for s in data["scenarios"]] == PROMPTS
    for side, step in (("a", 0), ("b", 1)):
        groups = trained.read_trajectories("train", step)
        for scenario, group in zip(data["scenarios"], groups, strict=True):
            rewards = [t.reward for t in group.trajectories]
            assert scenario[side]["mean_reward"] == pytest.approx(sum(rewards) / len(rewards))
            assert [r["id"] for r in scenario[side]["rollouts"]] == [t.id for t in group]
    bad = viewer.get("/api/compare", params={"a": "ui/ui-agent/train", "b": "x"})
    assert bad.status_code == 400 and "project/model/split/step" in bad.json()["error"]["message"]


def test_pages_and_assets_are_served_offline(viewer: httpx.Client) -> None:
    for path in ("/", "/run/ui/ui-agent", "/step/ui/ui-agent/train/0", "/compare?a=1&b=2"):
        page = viewer.get(path)
        assert page.status_code == 200 and "static/app.js" in page.text
        assert "default-src 'self'" in page.headers["content-security-policy"]
        # Nothing is loaded from anywhere else (no CDN): every src/href is this server's.
        assert "http://" not in page.text and "https://" not in page.text
    for asset in ("app.js", "chart.js", "style.css"):
        body = viewer.get(f"/static/{asset}")
        assert body.status_code == 200
        assert "https://" not in body.text.replace("http://www.w3.org/2000/svg", "")


def test_viewer_never_writes(viewer: httpx.Client, trained: ModelFolder) -> None:
    before = files_of(trained.root)
    trajectory = trained.read_trajectories("train", 0)[0].trajectories[0]
    for path in (
        "/api/runs",
        "/api/runs/ui/ui-agent",
        "/api/runs/ui/ui-agent/steps/train/0",
        f"/api/runs/ui/ui-agent/steps/train/0/rollouts/{trajectory.id}",
        "/api/runs/ui/ui-agent/curve.csv?id=reward",
    ):
        assert viewer.get(path).status_code == 200
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            assert viewer.request(method, path).status_code == 405
    assert files_of(trained.root) == before


def test_bad_addresses_get_clear_errors(viewer: httpx.Client) -> None:
    cases = {
        "/api/runs/ui/nobody": (404, "no model ui/nobody"),
        "/api/runs/%2E%2E/ui-agent": (404, None),
        "/api/runs/ui/%2E%2E": (404, None),
        "/api/runs/ui/ui-agent/steps/train/abc": (400, "step 'abc' is not valid"),
        "/api/runs/ui/ui-agent/steps/train/99": (404, "no trajectories file train/0099.jsonl"),
        "/api/runs/ui/ui-agent/steps/..%2F..%2Fx/0": (404, None),
        "/api/runs/ui/ui-agent/steps/%2E%2E/0": (400, "split '..' is not valid"),
        "/api/runs/ui/ui-agent/steps/train/0/rollouts/rollout_missing": (404, "no rollout"),
        "/api/runs/ui/ui-agent/curve.csv?id=nope": (404, "no curve 'nope'"),
        "/api/nothing-here": (404, "no such route"),
    }
    for path, (status, message) in cases.items():
        response = viewer.get(path)
        assert response.status_code == status, path
        if response.headers.get("content-type", "").startswith("application/json"):
            error = response.json()["error"]["message"]
            assert message is None or message in error, (path, error)


def damaged_copy(trained: ModelFolder, tmp_path: Path) -> ModelFolder:
    root = tmp_path / "art" / "ui" / "models" / "ui-agent"
    shutil.copytree(trained.root, root, ignore=shutil.ignore_patterns("checkpoints"))
    return ModelFolder(root)


def test_damaged_folder_shows_what_is_wrong(trained: ModelFolder, tmp_path: Path) -> None:
    folder = damaged_copy(trained, tmp_path)
    folder.model_json.write_text("{not json", encoding="utf-8")
    with folder.history.open("a", encoding="utf-8") as file:
        file.write('{"step": 5, "split": "train", "train/rew\n[1, 2]\n')
    step_file = folder.trajectories("train", 0)
    lines = step_file.read_text(encoding="utf-8").splitlines()
    step_file.write_text(lines[0] + "\n" + "garbage{\n" + lines[1][: len(lines[1]) // 2])
    (folder / "signals" / "train" / "0000.jsonl").write_text("not json\n", encoding="utf-8")
    broken = json.loads(lines[0])
    broken["trajectories"][0]["calls"][0]["logprobs"] = "nope"
    broken["trajectories"][1]["reward"] = "high"
    broken["trajectories"][2]["calls"] = None
    folder.trajectories("train", 1).write_text(json.dumps(broken) + "\n", encoding="utf-8")

    with ViewerServer(tmp_path / "art") as server, httpx.Client(base_url=server.url) as client:
        [run] = client.get("/api/runs").json()["runs"]
        assert any("model.json is not JSON" in p for p in run["problems"])
        assert any("is not a JSON record" in p for p in run["problems"])
        page = client.get("/api/runs/ui/ui-agent").json()
        assert page["curves"] and page["summary"]["checkpoint_step"] == 0

        step = client.get("/api/runs/ui/ui-agent/steps/train/0").json()
        assert len(step["rows"]) == GROUP_SIZE
        problems = " | ".join(step["problems"])
        assert "line 2 is not a trajectory group" in problems
        assert "the last line is cut short" in problems
        assert "signals/train/0000.jsonl: line 1 is damaged" in problems

        rows = client.get("/api/runs/ui/ui-agent/steps/train/1").json()["rows"]
        assert rows[1]["reward"] is None and rows[2]["turns"] is None
        rollout = client.get(f"/api/runs/ui/ui-agent/steps/train/1/rollouts/{rows[0]['id']}")
        assert rollout.status_code == 200
        tokens = rollout.json()["tokens"]
        assert not tokens["available"] and "cannot be assembled" in tokens["reason"]
        empty = client.get(f"/api/runs/ui/ui-agent/steps/train/1/rollouts/{rows[2]['id']}")
        assert "no recorded calls" in empty.json()["tokens"]["reason"]


def test_run_page_shows_diagnoses_and_evaluations(trained: ModelFolder, tmp_path: Path) -> None:
    """Why a step learned little and each evaluation with its intervals, as recorded; a record
    of the wrong shape is named, not shown half-read."""
    folder = damaged_copy(trained, tmp_path)
    runs = [art.Trajectory(reward=0.0, metadata={"final_answer": str(n)}) for n in range(4)]
    diagnoses = [d.model_dump() for d in diagnose([art.TrajectoryGroup(runs)])]
    evaluation = {
        "split": "eval",
        "step": 2,
        "time": 1.0,
        "eval_split": "test",
        "eval_label": "best",
        "tasks": 20,
        "runs": 80,
        "eval/mean_reward": 0.41,
        "eval/mean_reward_low": 0.3,
        "eval/mean_reward_high": 0.53,
        "eval/pass@4": 0.7,
        "eval/pass@4_low": 0.5,
        "eval/pass@4_high": 0.85,
        "eval/tokens_per_run": 31.5,
    }
    with folder.history.open("a", encoding="utf-8") as file:
        for record in (
            {"step": 7, "split": "diagnoses", "time": 1.0, "diagnoses": diagnoses},
            evaluation,
            {"step": 8, "split": "diagnoses", "diagnoses": [{"code": "x"}]},
        ):
            file.write(json.dumps(record) + "\n")
    with ViewerServer(tmp_path / "art") as server, httpx.Client(base_url=server.url) as client:
        page = client.get("/api/runs/ui/ui-agent").json()
    [shown] = [s for s in page["diagnoses"] if s["step"] == 7]
    assert [d["code"] for d in shown["diagnoses"]] == ["constant_reward"]
    assert shown["diagnoses"][0]["finding"] == diagnoses[0]["finding"]
    assert "check the reward function" in shown["diagnoses"][0]["setting"]
    assert not any(s["step"] == 8 for s in page["diagnoses"])
    assert any("a diagnosis without code/finding/setting" in p for p in page["summary"]["problems"])
    [shown_eval] = page["evals"]
    assert (shown_eval["step"], shown_eval["label"], shown_eval["split"]) == (2, "best", "test")
    assert shown_eval["metrics"] == [
        {"name": "mean_reward", "value": 0.41, "low": 0.3, "high": 0.53},
        {"name": "pass@4", "value": 0.7, "low": 0.5, "high": 0.85},
    ]
    assert shown_eval["tokens_per_run"] == 31.5 and shown_eval["tool_errors_per_run"] is None


def test_missing_tokenizer_shows_ids(trained: ModelFolder, tmp_path: Path) -> None:
    folder = damaged_copy(trained, tmp_path)
    info = json.loads(folder.model_json.read_text(encoding="utf-8"))
    folder.model_json.write_text(json.dumps({**info, "base_model": "gone-model"}))
    trajectory = folder.read_trajectories("train", 0)[0].trajectories[0]
    with ViewerServer(tmp_path / "art") as server:
        page = httpx.get(
            f"{server.url}/api/runs/ui/ui-agent/steps/train/0/rollouts/{trajectory.id}", timeout=30
        ).json()
    assert "no tokenizer.json found" in page["tokens"]["tokenizer"]
    trained_tokens = [
        t
        for s in page["tokens"]["sequences"][0]["segments"]
        if s["kind"] == "trained"
        for t in s["tokens"]
    ]
    assert all(t[1] == f"#{t[0]}" for t in trained_tokens)


def test_empty_and_missing_folders(tmp_path: Path) -> None:
    with ViewerServer(tmp_path) as server:
        data = httpx.get(f"{server.url}/api/runs", timeout=30).json()
    assert data["runs"] == [] and "no models in" in data["problems"][0]
    with ViewerServer(tmp_path / "missing") as server:
        data = httpx.get(f"{server.url}/api/runs", timeout=30).json()
    assert "is not a folder" in data["problems"][0]


def test_token_from_header_cookie_or_address(trained: ModelFolder, art_path: Path) -> None:
    def wrap(app):  # type: ignore[no-untyped-def]
        return BrowserTokenAuth(app, "s3cret")

    with ViewerServer(art_path, wrap=wrap) as server, httpx.Client(base_url=server.url) as client:
        refused = client.get("/api/runs")
        assert refused.status_code == 401 and "?token=" in refused.text
        assert client.get("/api/runs", params={"token": "wrong"}).status_code == 401
        ok = client.get("/api/runs", headers={"authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        login = client.get("/run/ui/ui-agent", params={"token": "s3cret", "x": "1"})
        assert login.status_code == 303 and login.headers["location"] == "/run/ui/ui-agent?x=1"
        assert "HttpOnly" in login.headers["set-cookie"]
        assert "token" not in login.headers["location"]
        # The cookie the redirect set now opens every page and route.
        assert client.get("/api/runs").status_code == 200
        assert client.get("/run/ui/ui-agent").status_code == 200


def test_serve_has_the_viewer_under_ui_behind_its_token(
    trained: ModelFolder, tmp_path: Path
) -> None:
    art_folder = tmp_path / "art"
    shutil.copytree(trained.root, art_folder / "ui" / "models" / "ui-agent")
    server = ServerProcess(art_folder, token="serve-token").start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            assert client.get("/ui/api/runs").status_code == 401
            assert client.get("/v1/models").status_code == 401
            headers = {"authorization": "Bearer serve-token"}
            [run] = client.get("/ui/api/runs", headers=headers).json()["runs"]
            assert run["name"] == "ui-agent" and run["checkpoint_step"] == TRAIN_STEPS
            login = client.get("/ui/", params={"token": "serve-token"})
            assert login.status_code == 303 and login.headers["location"] == "/ui/"
            assert "Path=/ui" in login.headers["set-cookie"]
            page = client.get("/ui/run/ui/ui-agent")
            assert page.status_code == 200 and 'content="/ui"' in page.text
            assert client.get("/ui/static/app.js").status_code == 200
            # The cookie opens the viewer only, not the API or the gateway.
            assert client.get("/v1/models").status_code == 401
    finally:
        server.stop()


def test_cli_serves_the_folder_and_needs_a_token_off_loopback(
    trained: ModelFolder, art_path: Path
) -> None:
    process, lines = start_ui([str(art_path)])
    try:
        url = lines[-1].removeprefix("art-core ui: open ")
        assert "token" not in url
        runs = httpx.get(f"{url}api/runs", timeout=30).json()["runs"]
        assert ("ui", "ui-agent") in {(r["project"], r["name"]) for r in runs}
    finally:
        stop_ui(process)
    process, lines = start_ui([str(art_path), "--host", "0.0.0.0"])
    try:
        url = lines[-1].removeprefix("art-core ui: open ")
        assert "token generated" in " ".join(lines)
        base, _, token = url.partition("?token=")
        local = base.replace("0.0.0.0", "127.0.0.1")
        assert httpx.get(f"{local}api/runs", timeout=30).status_code == 401
        headers = {"authorization": f"Bearer {token}"}
        assert httpx.get(f"{local}api/runs", headers=headers, timeout=30).status_code == 200
    finally:
        stop_ui(process)
    missing = subprocess.run(
        [sys.executable, "-m", "art_core.cli", "ui", str(art_path / "nowhere")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 2 and "is not a folder" in missing.stdout
