"""Run by test_tracing_weave.py in its own process: weave.init changes process-wide state
(its client, OpenTelemetry's global provider) that must not leak into the other tests.

Starts the Weave stand-in, points the real ``weave`` SDK at it, traces rollouts (two through
``gather`` with RULER, one inside a user's ``@weave.op``), and writes what the stand-in
received to the JSON file named on the command line.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault(
    "ART_CORE_MODELS_DIR", str(Path(tempfile.gettempdir()) / "art-core-test-models")
)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import weave
from tracing_support import tool_rollout

import art_core as art
from art_core import metrics, tracing
from art_core.metrics.wandb import run_id
from art_core.rewards import ruler_score_group
from art_core.testing.judge import StandInJudge
from art_core.testing.standins import WeaveStandIn


async def main(out: Path, work: Path) -> None:
    with WeaveStandIn() as server, StandInJudge() as judge:
        os.environ.update(server.env())
        client = weave.init("tester/art-tests")
        flushes: list[None] = []  # the client's flushes, ours and the SDK's
        flush = client.flush
        client.flush = lambda: flushes.append(None) or flush()
        tracing.enable("weave")
        # W&B metric logging on (offline; nothing is logged here): calls carry its run id.
        metrics.enable_wandb(mode="offline", dir=str(work))
        async with art.LocalBackend(path=work) as backend:
            model = art.TrainableModel(name="tiny", project="weave-tests", base_model="tiny-random")
            await model.register(backend)

            groups = await art.gather_trajectory_groups(
                [art.TrajectoryGroup(tool_rollout(model, h, scenario="w") for h in (0.2, 0.8))],
                after_each=lambda g: ruler_score_group(
                    g, "judge-1", judge_base_url=judge.base_url, cache_path=work / "r.sqlite"
                ),
                pbar_desc=None,
            )

            @weave.op
            async def my_rollout(hint: float) -> float:
                trajectory = await tool_rollout(model, hint, scenario="op")
                return trajectory.reward

            await my_rollout(0.5)
            assert tracing.flush(30), "weave flush timed out"
            flushed = len(flushes)
        tracing.disable()
        flushes_after_the_flush = len(flushes) - flushed
        metrics.disable_wandb(30)
        weave.finish()
        result = {
            "calls": list(server.calls.values()),
            "feedback": server.feedback,
            "objects": [o.get("object_id") for o in server.objects],
            "rewards": {t.id: t.reward for g in groups for t in g},
            "wandb_run_id": f"tester/art-tests/{run_id('weave-tests', 'tiny')}",
            "flushes_after_the_flush": flushes_after_the_flush,
        }
    await asyncio.to_thread(out.write_text, json.dumps(result, default=str))


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(main(Path(sys.argv[1]), Path(folder)))
