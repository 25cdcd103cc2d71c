"""Weave's real SDK records each rollout as a call tree against a loopback stand-in of its
trace server, with reward and RULER score as feedback, under the user's own ``@weave.op``.

Runs ``tracing_weave_run.py`` in a child process: ``weave.init`` sets process-wide state (its
client, OpenTelemetry's global tracer provider) that must not leak into other tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _op(call: dict) -> str:
    return str(call["op_name"]).split("/op/")[-1].split(":")[0]


@pytest.fixture(scope="module")
def weave_record(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("weave") / "record.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, str(HERE / "tracing_weave_run.py"), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


def test_weave_records_each_rollout_as_a_call_tree(weave_record: dict) -> None:
    calls = weave_record["calls"]
    rollouts = [c for c in calls if _op(c) == "art.rollout"]
    assert len(rollouts) == 3
    for rollout in rollouts:
        kids = sorted(
            (c for c in calls if c["parent_id"] == rollout["id"]), key=lambda c: c["started_at"]
        )
        assert [_op(c) for c in kids] == ["art.chat", "art.tool.get_weather", "art.chat"]
        assert all(c["trace_id"] == rollout["trace_id"] for c in kids)
        # The gateway's times, not the export time: children inside the rollout, in order.
        assert _time(rollout["started_at"]) <= _time(kids[0]["started_at"])
        assert _time(kids[0]["ended_at"]) <= _time(kids[1]["started_at"])
        assert _time(kids[2]["ended_at"]) <= _time(rollout["ended_at"])
        chat = kids[0]
        assert chat["inputs"]["messages"][0]["role"] == "user"
        usage = chat["summary"]["usage"]["tiny"]
        assert (
            usage["requests"] == 1 and usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
        )
        assert chat["attributes"]["art"]["art.adapter_step"] == 0
        assert "gen_ai.input.messages" not in chat["attributes"]["art"]  # shown as inputs instead
        assert kids[1]["output"].startswith("12°C")
        assert kids[1]["inputs"]["arguments"]["city"] in ("Paris", "Tokyo", "Lima")


def test_weave_gets_reward_and_ruler_score_as_feedback_and_summary(weave_record: dict) -> None:
    calls = {c["id"]: c for c in weave_record["calls"]}
    gathered = [
        c for c in calls.values() if _op(c) == "art.rollout" and c["display_name"] == "rollout w"
    ]
    assert len(gathered) == 2
    rewards = sorted(weave_record["rewards"].values())
    assert (
        sorted(c["summary"]["art"]["reward"] for c in gathered)
        == pytest.approx(rewards)
        == [0.2, 0.8]
    )
    for call in gathered:
        mine = {
            f["feedback_type"]: f["payload"]
            for f in weave_record["feedback"]
            if f["weave_ref"].endswith(f"/call/{call['id']}")
        }
        assert mine["reward"]["value"] == pytest.approx(call["summary"]["art"]["reward"])
        assert mine["ruler_score"]["value"] == pytest.approx(call["summary"]["art"]["reward"])
        assert "hint" in mine["ruler_score"]["explanation"]
        assert call["output"]["reward"] == pytest.approx(call["summary"]["art"]["reward"])


def test_a_rollout_inside_a_users_weave_op_is_its_child(weave_record: dict) -> None:
    calls = {c["id"]: c for c in weave_record["calls"]}
    (op_call,) = [c for c in calls.values() if _op(c) == "my_rollout"]
    (inner,) = [
        c for c in calls.values() if _op(c) == "art.rollout" and c["display_name"] == "rollout op"
    ]
    assert inner["parent_id"] == op_call["id"] and inner["trace_id"] == op_call["trace_id"]
    assert set(weave_record["objects"]) >= {
        "my_rollout",
        "art.rollout",
        "art.chat",
        "art.tool.get_weather",
    }


def test_each_rollout_is_a_weave_thread_whose_calls_are_its_turns(weave_record: dict) -> None:
    calls = weave_record["calls"]
    rollouts = [c for c in calls if _op(c) == "art.rollout"]
    for rollout in rollouts:
        thread = rollout["inputs"]["rollout_id"]
        # The rollout call holds the thread; each model and tool call in it is one turn.
        assert rollout.get("thread_id") is None and rollout.get("turn_id") is None
        kids = [c for c in calls if c["parent_id"] == rollout["id"]]
        assert len(kids) == 3
        for kid in kids:
            assert kid["thread_id"] == thread and kid["turn_id"] == kid["id"]
        # metrics.enable_wandb is on: every call names the model's W&B run.
        for call in (rollout, *kids):
            assert call["wb_run_id"] == weave_record["wandb_run_id"]
    assert len({r["inputs"]["rollout_id"] for r in rollouts}) == 3


def test_disabling_after_a_flush_does_not_flush_again(weave_record: dict) -> None:
    """``tracing.disable()`` right after ``tracing.flush()``: nothing of ours was handed to
    the client since, so the sink does not flush it again (a Weave flush waits out its batch
    intervals, about 2 s, even with nothing queued); everything was recorded all the same."""
    assert weave_record["flushes_after_the_flush"] == 0
    assert len([c for c in weave_record["calls"] if _op(c) == "art.rollout"]) == 3
