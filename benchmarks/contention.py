"""One GRPO step alone vs with a competing CPU-bound process: how much slower do we get?

A step is the full public loop on the embedded smollm2-135m: 2 questions x 4 rollouts through
the gateway (32 tokens max), then ``model.train`` (engine paused, GRPO step, adapter
hot-swapped). Each configuration runs in its own process (OpenMP reads its wait policy when
torch loads): warm-up steps, then ``--steps`` steps alone interleaved with as many while another
process burns one core (``while True: pass``), which is what a second job on a 2-core box
does. Goal (issue 19): at most 2.5x slower with the competitor (it takes half the cores).

Configurations:
- ``spin``: torch imported before art_core, so libgomp keeps its default (threads spin at
  barriers): the behaviour before art_core set a wait policy.
- ``passive``: ``OMP_WAIT_POLICY=PASSIVE`` (threads sleep at barriers; waking them costs,
  most in a VM where an idle vCPU halts).
- ``follow``: libgomp's default wait, and the threads follow the cores other processes leave
  free (``art_core.device.follow_free_cores``, read from ``/proc/stat`` every 0.5 s).

Run:  bash run.sh bench contention            (or: python benchmarks/contention.py --steps 3)
      bash run.sh bench contention --smoke    (tiny-random, every configuration, ~1 min)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from _machine import machine_line

from art_core.cpu import cpu_model

QUESTIONS = [(12, "+", 7), (9, "*", 8), (25, "+", 4), (31, "*", 6)]


def _child(args: argparse.Namespace) -> None:
    """Measure one configuration in this process; print a JSON line with the step times."""
    if args.policy in ("spin", "follow"):
        import torch  # noqa: F401  (before art_core: libgomp keeps spinning waits)
    import asyncio

    import art_core as art

    async def run(folder: str) -> dict[str, object]:
        backend = art.LocalBackend(path=folder)
        model = art.TrainableModel(name="m", project="contention", base_model=args.base_model)
        await model.register(backend)

        async def rollout(question: tuple[int, str, int], seed: int) -> art.Trajectory:
            a, op, b = question
            async with art.capture(model) as run:
                answer = await run.openai_client().chat.completions.create(
                    model=run.model_name,
                    messages=[
                        {
                            "role": "user",
                            "content": f"What is {a} {op} {b}? Answer with the number only.",
                        }
                    ],
                    max_tokens=32,
                    seed=seed,
                )
            text = answer.choices[0].message.content or ""
            chars = [c for c in text if not c.isspace()]
            return run.trajectory(reward=sum(c.isdigit() for c in chars) / max(len(chars), 1))

        async def step() -> float:
            # Every step does the same work: the same questions and seeds, and a learning
            # rate too small to change a sampled token (a learning policy answers shorter
            # and shorter, which would make later steps cheaper, whatever the competition).
            started = time.perf_counter()
            groups = await art.gather_trajectory_groups(
                (art.TrajectoryGroup(rollout(q, i) for i in range(4)) for q in QUESTIONS[:2]),
                pbar_desc=None,
            )
            await model.train(groups, config=art.TrainConfig(learning_rate=1e-9))
            return time.perf_counter() - started

        for _ in range(args.warmup):
            await step()
        alone, contended = [], []
        for _ in range(args.steps):  # interleaved, so a drift of the machine hits both
            alone.append(await step())
            burner = await asyncio.create_subprocess_exec(sys.executable, "-c", "while True: pass")
            try:
                await asyncio.sleep(0.2)  # the competitor is running before the step starts
                contended.append(await step())
            finally:
                burner.kill()
                await burner.wait()
        await backend.close()
        import torch

        return {
            "alone": alone,
            "contended": contended,
            "threads": torch.get_num_threads(),
            "policy_env": os.environ.get("OMP_WAIT_POLICY", "(unset)"),
        }

    with tempfile.TemporaryDirectory(prefix="art-contention-") as folder:
        result = asyncio.run(run(folder))
    print("RESULT " + json.dumps(result), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base-model", default="smollm2-135m")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--policies", default="spin,passive,follow")
    parser.add_argument("--policy", help=argparse.SUPPRESS)  # set in the child process
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny-random, no warm-up, 1 step per phase, every configuration",
    )
    args = parser.parse_args()
    print(machine_line(), flush=True)  # the figures below depend on it
    if args.smoke:
        args.base_model, args.steps, args.warmup = "tiny-random", 1, 0
    if args.policy:
        _child(args)
        return
    print(
        f"CPU: {cpu_model()}, {os.cpu_count()} cores; {args.base_model}; {args.steps} steps per phase"
    )
    rows = []
    for policy in args.policies.split(","):
        env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
        env["ART_CORE_FOLLOW_FREE_CORES"] = "1" if policy == "follow" else "0"
        command = [sys.executable, __file__, "--policy", policy, "--base-model", args.base_model]
        command += ["--steps", str(args.steps), "--warmup", str(args.warmup)]
        out = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            raise SystemExit(f"{policy} failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
        result = json.loads(line.removeprefix("RESULT "))
        alone = statistics.median(result["alone"])
        contended = statistics.median(result["contended"])
        rows.append((policy, result["policy_env"], result["threads"], alone, contended))
    print()
    print(
        f"{'config':<9} {'OMP_WAIT_POLICY':<16} {'threads':>7} {'alone s/step':>13} {'contended':>10} {'slowdown':>9}"
    )
    for policy, env, threads, alone, contended in rows:
        print(
            f"{policy:<9} {env:<16} {threads:>7} {alone:>13.2f} {contended:>10.2f} {contended / alone:>8.2f}x"
        )
    print("\ngoal: slowdown <= 2.5x with one competing CPU-bound process")


if __name__ == "__main__":
    main()
