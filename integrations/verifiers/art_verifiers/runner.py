"""Runs a verifiers environment's rollouts inside the verifiers venv, each against its own base
URL, and writes what the environment made of them as JSON.

This file is executed by path with the verifiers runtime's interpreter
(``python runner.py JOB.json OUT.json``), so it imports only the standard library, ``openai``
and ``verifiers`` (never ``art_core``: that lives in the other venv). The job names the
environment (``vf.load_environment(env_id, **env_args)``, the way verifiers loads its hub
environments), the dataset split, the model name, sampling arguments and one entry per rollout:
the rollout's base URL (the gateway, scoped to that rollout) and the dataset row it runs. Each
rollout is the environment's own ``run_rollout`` with an ``AsyncOpenAI`` client on that base
URL; its rubric scores it. The output holds, per rollout, the reward, the rubric's metrics, the
completion messages and any error, in the job's order.

Example:
    >>> job = {"environment": "reverse_text", "model": "m", "rollouts": []}
    >>> sorted(validate_job(job))
    ['api_key', 'env_args', 'environment', 'max_concurrent', 'model', 'paths', 'rollouts', 'sampling_args', 'split']
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
import traceback
from typing import Any

JOB_KEYS = {
    "environment": str,
    "model": str,
    "rollouts": list,
    "env_args": dict,
    "paths": list,
    "split": str,
    "sampling_args": dict,
    "api_key": str,
    "max_concurrent": int,
}
DEFAULTS: dict[str, Any] = {
    "env_args": {},
    "paths": [],
    "split": "train",
    "sampling_args": {},
    "api_key": "art",
    "max_concurrent": 32,
}


def validate_job(job: Any) -> dict[str, Any]:
    """The job with its defaults filled in; ``ValueError`` naming what is wrong otherwise."""
    if not isinstance(job, dict):
        raise ValueError(f"the job must be a JSON object, got {type(job).__name__}")
    unknown = set(job) - set(JOB_KEYS)
    if unknown:
        raise ValueError(f"unknown job keys: {sorted(unknown)}")
    out = {**DEFAULTS, **job}
    for key, kind in JOB_KEYS.items():
        if key not in out:
            raise ValueError(f"the job lacks {key!r}")
        if not isinstance(out[key], kind):
            raise ValueError(f"job[{key!r}] must be a {kind.__name__}, got {out[key]!r}")
    if out["split"] not in ("train", "eval"):
        raise ValueError(f"job['split'] must be 'train' or 'eval', got {out['split']!r}")
    for i, entry in enumerate(out["rollouts"]):
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("base_url"), str)
            and isinstance(entry.get("example"), int)
            and not isinstance(entry.get("example"), bool)
        ):
            raise ValueError(f"job['rollouts'][{i}] must be {{base_url: str, example: int}}")
    return out


def _jsonable(value: Any) -> Any:
    """Messages and metrics as plain JSON (verifiers' messages may be pydantic models)."""
    if hasattr(value, "model_dump"):
        return _jsonable(value.model_dump(exclude_none=True))
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


async def run_job(job: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rollout of ``job`` through the environment's own ``run_rollout``."""
    for path in reversed(job["paths"]):
        sys.path.insert(0, path)
    vf = importlib.import_module("verifiers")
    clients = importlib.import_module("verifiers.clients")
    openai = importlib.import_module("openai")
    env = vf.load_environment(job["environment"], **job["env_args"])
    dataset = env.get_dataset() if job["split"] == "train" else env.get_eval_dataset()
    rows = dataset.to_list()
    sampling_args = {**(getattr(env, "sampling_args", None) or {}), **job["sampling_args"]}
    limit = asyncio.Semaphore(job["max_concurrent"])

    async def one(index: int, entry: dict[str, Any]) -> dict[str, Any]:
        example = entry["example"]
        if not 0 <= example < len(rows):
            return {"index": index, "error": f"example {example} is not in 0..{len(rows) - 1}"}
        client = openai.AsyncOpenAI(base_url=entry["base_url"], api_key=job["api_key"])
        async with limit:
            try:
                output = await env.run_rollout(
                    rows[example],
                    clients.OpenAIChatCompletionsClient(client),
                    job["model"],
                    sampling_args,
                )
            except Exception:  # reported per rollout: the other rollouts still count
                return {"index": index, "error": traceback.format_exc(limit=8)}
            finally:
                await client.close()
        error = output.get("error")
        return {
            "index": index,
            "example_id": output.get("example_id"),
            "reward": output.get("reward"),
            "metrics": _jsonable(output.get("metrics") or {}),
            "completion": _jsonable(output.get("completion") or []),
            "answer": _jsonable(output.get("answer")),
            "is_completed": bool(output.get("is_completed")),
            "is_truncated": bool(output.get("is_truncated")),
            "stop_condition": output.get("stop_condition"),
            "error": None if error is None else json.dumps(_jsonable(error)),
        }

    return list(await asyncio.gather(*(one(i, e) for i, e in enumerate(job["rollouts"]))))


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: runner.py JOB.json OUT.json", file=sys.stderr)
        return 2
    with open(argv[1]) as file:
        job = validate_job(json.load(file))
    results = asyncio.run(run_job(job))
    with open(argv[2], "w") as file:
        json.dump({"results": results}, file)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
