"""Rollouts of an unchanged verifiers environment, captured token-exactly through the gateway.

Each rollout opens an ``art.capture`` (its own rollout id and base URL); the environment then
runs in the verifiers runtime (a subprocess: verifiers lives in its own venv,
``art_verifiers.runtime``), one ``AsyncOpenAI`` client per rollout pointed at that rollout's
base URL, and scores every rollout with its own rubric. Back here each rollout becomes an
``art.Trajectory`` built from the gateway's record of its calls, with the rubric's reward and
metrics, and the rollouts of one dataset example form one ``art.TrajectoryGroup``.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import tempfile
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import art_core as art
from art_verifiers.runtime import runtime_python

RUNNER = Path(__file__).with_name("runner.py")
_STDERR_TAIL_CHARS = 4000


class VerifiersError(RuntimeError):
    """The verifiers runtime failed, or said something that is not a valid result."""


@dataclass
class VerifiersEnv:
    """Which verifiers environment to run and how.

    ``environment`` is the id ``vf.load_environment`` takes (an installed environment module,
    e.g. one from the Environments Hub), called with ``env_args``. ``paths`` are folders put on
    the runtime's ``sys.path`` first (an environment module that is not installed). ``split``
    picks the dataset (``train``: ``env.get_dataset()``, ``eval``: ``env.get_eval_dataset()``).
    ``python`` is the interpreter with verifiers (default: the runtime ``art-core verifiers
    install`` creates). ``env_vars`` are added to the runtime's environment.

    Example:
        >>> VerifiersEnv("reverse_text").split
        'train'
    """

    environment: str
    env_args: dict[str, Any] = field(default_factory=dict)
    paths: list[str] = field(default_factory=list)
    split: Literal["train", "eval"] = "train"
    python: Path | None = None
    env_vars: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 900.0

    def __post_init__(self) -> None:
        if not self.environment.strip():
            raise ValueError("environment is empty: give the id vf.load_environment takes")
        if self.split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {self.split!r}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        # Absolute: the runtime runs in a folder of its own.
        self.paths = [str(Path(p).resolve()) for p in self.paths]


async def rollout_groups(
    model: art.TrainableModel,
    env: VerifiersEnv,
    examples: Sequence[int],
    *,
    rollouts_per_example: int = 4,
    sampling_args: dict[str, Any] | None = None,
    max_concurrent: int = 32,
    raise_on_error: bool = True,
) -> list[art.TrajectoryGroup]:
    """Run ``rollouts_per_example`` rollouts of each dataset row in ``examples`` (indices into
    the split) and return one group per example, in order, each trajectory rewarded by the
    environment's rubric (``trajectory.metrics`` holds the rubric's per-function scores).

    All rollouts run in one call of the verifiers runtime, concurrently (``max_concurrent``).
    A rollout the environment reports as failed raises ``VerifiersError`` (with
    ``raise_on_error=False`` it is kept in its group's ``exceptions`` instead, as
    ``art.gather_trajectory_groups`` keeps a rollout that raised).

    Example:
        >>> env = VerifiersEnv("reverse_text")
        >>> groups = await rollout_groups(model, env, [0, 1], rollouts_per_example=4)  # needs a registered model, and the verifiers venv (an install)  # doctest: +SKIP
        >>> result = await model.train(groups)  # needs a registered model  # doctest: +SKIP
    """
    if rollouts_per_example < 1:
        raise ValueError(f"rollouts_per_example must be >= 1, got {rollouts_per_example}")
    if max_concurrent < 1:
        raise ValueError(f"max_concurrent must be >= 1, got {max_concurrent}")
    examples = list(examples)  # read twice below: a generator would be spent
    bad = [e for e in examples if isinstance(e, bool) or not isinstance(e, int) or e < 0]
    if bad:
        raise ValueError(f"examples must be dataset row indices (ints >= 0), got {bad}")
    python = env.python or runtime_python()
    plan = [example for example in examples for _ in range(rollouts_per_example)]
    async with AsyncExitStack() as stack:
        runs = [
            await stack.enter_async_context(
                art.capture(
                    model,
                    metadata={
                        "verifiers_env": env.environment,
                        "split": env.split,
                        "example": example,
                    },
                )
            )
            for example in plan
        ]
        job = {
            "environment": env.environment,
            "env_args": env.env_args,
            "paths": env.paths,
            "split": env.split,
            "model": runs[0].model_name if runs else model.name,
            "api_key": model.inference_api_key or "art",
            "sampling_args": dict(sampling_args or {}),
            "max_concurrent": max_concurrent,
            "rollouts": [
                {"base_url": run.base_url, "example": example}
                for run, example in zip(runs, plan, strict=True)
            ],
        }
        results = await run_runtime(python, job, env_vars=env.env_vars, timeout_s=env.timeout_s)
    n = rollouts_per_example
    return [
        _group(
            env,
            example,
            runs[position * n : (position + 1) * n],
            results[position * n : (position + 1) * n],
            raise_on_error=raise_on_error,
        )
        for position, example in enumerate(examples)
    ]


def _group(
    env: VerifiersEnv,
    example: int,
    runs: Sequence[art.Run],
    results: Sequence[dict[str, Any]],
    *,
    raise_on_error: bool,
) -> art.TrajectoryGroup:
    """One example's group from its runs and the runtime's results for them: a failed
    rollout raises ``VerifiersError``, or without ``raise_on_error`` is kept as one."""
    trajectories: list[art.Trajectory | BaseException] = []
    for run, result in zip(runs, results, strict=True):
        if result["error"] is None:
            trajectories.append(to_trajectory(run, result))
            continue
        error = VerifiersError(
            f"rollout {run.rollout_id} (example {example}) failed in the environment "
            f"{env.environment!r}: {result['error']}"
        )
        if raise_on_error:
            raise error
        trajectories.append(error)
    return art.TrajectoryGroup(
        trajectories, metadata={"verifiers_env": env.environment, "example": example}
    )


def to_trajectory(run: art.Run, result: dict[str, Any]) -> art.Trajectory:
    """The trajectory of one captured rollout, with the environment's reward and metrics and
    the completion messages the environment saw (``metadata["completion"]``)."""
    return run.trajectory(
        reward=float(result["reward"]),
        metrics={str(k): float(v) for k, v in result["metrics"].items()},
        metadata={
            "example_id": result.get("example_id"),
            "completion": result["completion"],
            "answer": result.get("answer"),
            "stop_condition": result.get("stop_condition"),
            "is_truncated": bool(result.get("is_truncated")),
        },
    )


async def run_runtime(
    python: Path, job: dict[str, Any], *, env_vars: dict[str, str] | None = None, timeout_s: float
) -> list[dict[str, Any]]:
    """Run ``job`` with the verifiers runtime's ``python`` (``runner.py``) and return its
    validated results, one per rollout in the job's order."""
    with tempfile.TemporaryDirectory(prefix="art-verifiers-") as folder:
        job_path, out_path = Path(folder) / "job.json", Path(folder) / "out.json"
        job_path.write_text(json.dumps(job))
        # The runtime is another venv: nothing of this one's may leak into its imports.
        environ = {
            k: v
            for k, v in os.environ.items()
            if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")
        }
        environ.update(env_vars or {})
        process = await asyncio.create_subprocess_exec(
            str(python),
            str(RUNNER),
            str(job_path),
            str(out_path),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env=environ,
            cwd=folder,
        )
        try:
            _, stderr = await asyncio.wait_for(process.communicate(), timeout_s)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise VerifiersError(
                f"the verifiers runtime did not finish within {timeout_s:.0f} s"
            ) from None
        tail = stderr.decode(errors="replace")[-_STDERR_TAIL_CHARS:].strip()
        if process.returncode != 0:
            raise VerifiersError(
                f"the verifiers runtime ({python}) exited with {process.returncode}:\n{tail}"
            )
        try:
            output = json.loads(out_path.read_text())
        except (OSError, ValueError) as exc:
            raise VerifiersError(
                f"the verifiers runtime wrote no valid output ({exc}):\n{tail}"
            ) from exc
    return validate_results(output, len(job["rollouts"]))


def validate_results(output: Any, expected: int) -> list[dict[str, Any]]:
    """The runtime's results, checked: one per rollout in order, each either an error or a
    finite reward with numeric metrics and a list of completion messages.

    Example:
        >>> validate_results({"results": [{"index": 0, "error": "boom"}]}, 1)[0]["error"]
        'boom'
        >>> validate_results({"results": [{"index": 0, "reward": "high"}]}, 1)
        Traceback (most recent call last):
        ...
        art_verifiers.rollout.VerifiersError: rollout 0: the reward must be a finite number, got 'high'
    """
    results = output.get("results") if isinstance(output, dict) else None
    if not isinstance(results, list) or len(results) != expected:
        raise VerifiersError(
            f"expected {expected} results from the verifiers runtime, got {output!r:.300}"
        )
    checked: list[dict[str, Any]] = []
    for i, result in enumerate(results):
        if not isinstance(result, dict) or result.get("index") != i:
            raise VerifiersError(f"result {i} is not the result of rollout {i}: {result!r:.300}")
        error = result.get("error")
        if error is not None:
            checked.append({"index": i, "error": str(error)})
            continue
        reward = result.get("reward")
        if (
            isinstance(reward, bool)
            or not isinstance(reward, int | float)
            or not math.isfinite(reward)
        ):
            raise VerifiersError(f"rollout {i}: the reward must be a finite number, got {reward!r}")
        metrics = result.get("metrics")
        if not isinstance(metrics, dict) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            for v in metrics.values()
        ):
            raise VerifiersError(
                f"rollout {i}: metrics must map names to finite numbers, got {metrics!r:.300}"
            )
        completion = result.get("completion")
        if not isinstance(completion, list) or not all(isinstance(m, dict) for m in completion):
            raise VerifiersError(
                f"rollout {i}: completion must be a list of messages, got {completion!r:.300}"
            )
        checked.append({**result, "error": None})
    return checked
