"""Load benchmark of ``art-core serve``: N concurrent rollouts through the remote gateway.

Starts a server process (or uses ``--url``/``--token``), registers a model through
``RemoteBackend`` and runs ``--rollouts`` captured rollouts at once, each making ``--turns``
chat completions that carry the rollout's unique marker (in the prompt and in the call's
``metadata``). Afterwards every trajectory must hold exactly its own calls: any call with
another rollout's marker or rollout id counts as cross-talk. Prints latency percentiles
(per call and per rollout), errors and cross-talk as a markdown table.

``--fail N`` makes N of the rollouts (on top of ``--rollouts``) ask for a model the server
does not serve: each must end as an error of its own, with no cross-talk into the others
(those errors are expected; any other error, or cross-talk, exits with status 1).

Usage: bash run.sh bench load [--rollouts 256] [--turns 2] [--max-tokens 8] [--fail 0]
           [--base-model tiny-random] [--url http://host:7999 --token T]
       bash run.sh bench load --smoke   (a started server, 4 rollouts and 1 failing one)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field

from _children import spawn, stop, wait_for_url
from _machine import machine_line

import art_core as art


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return (
        ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")
    )


@dataclass
class Outcome:
    marker: str
    call_ms: list[float] = field(default_factory=list)
    rollout_ms: float = 0.0
    error: str | None = None
    cross_talk: int = 0
    failing: bool = False  # asked for a model the server lacks, on purpose (--fail)


def start_server(max_pending: int, token: str) -> tuple[subprocess.Popen[str], str]:
    """``art-core serve`` on a free loopback port, in a temporary art folder (its process
    group stopped with the benchmark, see ``_children``)."""
    path = tempfile.mkdtemp(prefix="art-load-")
    env = {**os.environ, "ART_CORE_TOKEN": token}
    process = spawn(
        [
            sys.executable,
            "-m",
            "art_core.server.cli",
            "--port",
            "0",
            "--path",
            path,
            "--max-pending",
            str(max_pending),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    return process, wait_for_url(process, "the server", 180)


async def one_rollout(
    model: art.TrainableModel, turns: int, max_tokens: int, failing: bool = False
) -> Outcome:
    outcome = Outcome(marker=f"m-{uuid.uuid4().hex[:12]}", failing=failing)
    started = time.perf_counter()
    try:
        async with art.capture(model, metadata={"marker": outcome.marker}) as run:
            client = run.openai_client(max_retries=10, timeout=300)
            messages: list[dict[str, str]] = [
                {"role": "user", "content": f"[{outcome.marker}] say something"}
            ]
            for turn in range(turns):
                call_start = time.perf_counter()
                response = await client.chat.completions.create(
                    model=run.model_name + ("-not-served" if failing else ""),
                    messages=messages,  # type: ignore[arg-type]
                    max_tokens=max_tokens,
                    extra_body={"metadata": {"marker": outcome.marker, "turn": turn}},
                )
                outcome.call_ms.append((time.perf_counter() - call_start) * 1000)
                messages.append(
                    {"role": "assistant", "content": response.choices[0].message.content or ""}
                )
                messages.append({"role": "user", "content": f"[{outcome.marker}] turn {turn + 1}"})
        calls = run.trajectory().calls
        if len(calls) != turns:
            outcome.cross_talk += abs(len(calls) - turns)
        for index, call in enumerate(calls):
            own = (
                call.rollout_id == run.rollout_id
                and call.metadata.get("marker") == outcome.marker
                and call.metadata.get("turn") == index
                and all(
                    outcome.marker in m["content"] for m in call.messages if m["role"] == "user"
                )
            )
            outcome.cross_talk += 0 if own else 1
    except Exception as exc:  # counted and reported, never hidden
        outcome.error = f"{type(exc).__name__}: {exc}"
    outcome.rollout_ms = (time.perf_counter() - started) * 1000
    return outcome


async def run(args: argparse.Namespace) -> int:
    process = None
    url, token = args.url, args.token
    if url is None:
        token = token or uuid.uuid4().hex
        process, url = start_server(args.max_pending, token)
    try:
        backend = art.RemoteBackend(url, token=token, progress=False)
        model = art.TrainableModel(name="load", project="bench", base_model=args.base_model)
        await model.register(backend)
        await one_rollout(model, 1, args.max_tokens)  # warm-up
        started = time.perf_counter()
        failing = [False] * args.rollouts + [True] * args.fail
        outcomes = await asyncio.gather(
            *(one_rollout(model, args.turns, args.max_tokens, f) for f in failing)
        )
        wall = time.perf_counter() - started
        await backend.close()
    finally:
        if process is not None:
            stop(process, grace_s=60)

    calls = [ms for o in outcomes for ms in o.call_ms]
    rollouts = [o.rollout_ms for o in outcomes if o.error is None]
    errors = [o.error for o in outcomes if o.error]
    # Unexpected: an error of a well-formed rollout, or a failing one that did not fail.
    unexpected = sum((o.error is not None) != o.failing for o in outcomes)
    cross_talk = sum(o.cross_talk for o in outcomes)
    failing_note = f" (+ {args.fail} failing on purpose)" if args.fail else ""
    print(
        f"\nload: {args.rollouts} concurrent rollouts{failing_note} x {args.turns} calls, "
        f"{args.base_model}, max_tokens={args.max_tokens}, through {url}\n"
    )
    print("| metric | value |")
    print("|---|---|")
    expected = f" ({args.fail} expected, {unexpected} unexpected)" if args.fail else ""
    rows = [
        ("rollouts (concurrent)", f"{args.rollouts + args.fail}"),
        ("calls completed", f"{len(calls)} / {args.rollouts * args.turns}"),
        ("errors", f"{len(errors)}{expected}"),
        ("cross-talk (calls in the wrong rollout)", f"{cross_talk}"),
        (
            "call latency p50 / p99",
            f"{percentile(calls, 0.5):.0f} ms / {percentile(calls, 0.99):.0f} ms",
        ),
        (
            "rollout latency p50 / p99",
            f"{percentile(rollouts, 0.5):.0f} ms / {percentile(rollouts, 0.99):.0f} ms",
        ),
        ("wall time", f"{wall:.1f} s"),
        ("throughput", f"{len(calls) / wall:.1f} calls/s"),
    ]
    for name, value in rows:
        print(f"| {name} | {value} |")
    for error in sorted(set(errors))[:5]:
        print(f"error: {error}")
    return 1 if unexpected or cross_talk else 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rollouts", type=int, default=256)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--base-model", default="tiny-random")
    parser.add_argument("--max-pending", type=int, default=512, help="for the started server")
    parser.add_argument("--url", default=None, help="use this running server instead")
    parser.add_argument("--token", default=os.environ.get("ART_CORE_TOKEN"))
    parser.add_argument(
        "--fail", type=int, default=0, help="extra rollouts asking for a model not served"
    )
    parser.add_argument(
        "--smoke", action="store_true", help="a started server, 4 rollouts + 1 failing one"
    )
    args = parser.parse_args()
    print(machine_line(), flush=True)  # the figures below depend on it
    if args.smoke:
        args.rollouts, args.turns, args.max_tokens, args.fail = 4, 2, 4, 1
        args.base_model, args.url = "tiny-random", None
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
