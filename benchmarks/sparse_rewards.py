"""Sparse rewards on a task nobody in the project wrote: plain GRPO vs dynamic sampling
(vs an SFT warm start, vs on-policy distillation from a stronger model).

The task comes from a public generator with its own verifier: reasoning-gym's procedural
``basic_arithmetic`` (``dataset.score_answer``: 1.0 for the exact answer). The agent is
smollm2-135m with the PyPI calculator MCP server (``mcp-server-calculator``, in its own venv:
``bash examples/mcp/setup_calculator.sh``), driven by ``art_mcp.rollout``: it must pass the
expression to ``calculate`` and report the number with ``complete_task``. The reward is the
verifier's score of that final answer, so most early groups are all zeros.

Arms, each a fresh LoRA on the same base model, trained for the same wall-time budget
(validation before and after is outside the budget):

- ``plain``: fixed groups (``--groups-per-step`` scenarios x ``--rollouts-per-group`` runs);
  groups whose rewards are all equal teach nothing and are skipped by the trainer.
- ``dynamic``: ``art.ScenarioSampler`` with dynamic sampling (groups are started until
  ``--groups-per-step`` have a signal, at most ``--max-rollouts-per-step`` rollouts),
  adaptive group size (``--max-group-size``) and the curriculum.
- ``dynamic+warm`` (``--warm-start``): first ``model.train_sft`` on demonstrations built from
  training scenarios (the ideal tool calls, with the calculator's real outputs), then as
  ``dynamic``; the SFT time counts in its budget. Needs ``train_sft`` (the SFT warm start):
  the option stops with an error where it is missing.
- ``distill`` (``--distill``): on-policy distillation from a stronger local teacher, added to
  the RL objective (``TrainConfig.teacher``: ``TeacherConfig(model=<the same base model>,
  adapter=<the teacher's checkpoint>, rl=True)``, top-20 reverse KL). The teacher is the same
  base model with a LoRA adapter that already does the task better: ``--teacher-adapter PATH``
  (a checkpoint folder), else the final checkpoint of this invocation's ``dynamic+warm`` arm
  (``--warm-start`` is then required). The teacher's own training is not counted in the
  distill arm's budget: it stands for the stronger model one already has. The student is a
  fresh LoRA (no SFT) trained for the same wall time as the other arms, on fixed groups like
  ``plain`` (dynamic sampling would discard the all-equal groups that the distillation term
  still learns from) with the curriculum on; the comparison is with ``dynamic+warm``.

The table: validation reward before / after and its change, steps, rollouts spent, groups
with a signal / all-equal, scenarios never solved, minutes, and for ``distill`` the step
mean of ``train/distill/kl`` at its first and last step; a line under it names the teacher
and its validation reward (measured by the ``dynamic+warm`` arm; not measured for a
``--teacher-adapter``). Goal: validation reward up by >= 0.3 within 20 minutes on 2 cores.

Run (reasoning-gym is in the ``bench`` extra):
    pip install -e ".[bench]" "torch==2.13.0"; bash examples/mcp/setup_calculator.sh
    python benchmarks/sparse_rewards.py --minutes 20 --warm-start
    python benchmarks/sparse_rewards.py --minutes 20 --warm-start --distill
    bash run.sh bench sparse_rewards --smoke   (tiny-random, every arm and path, ~2 min)

``--smoke`` runs the calculator package where its own venv was not set up: served by this
venv's mcp 2.x over HTTP, one process for every rollout (``benchmarks/_calculator_server.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _machine import machine_line

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SERVER = ROOT / "examples" / "mcp" / ".venv-calculator" / "bin" / "mcp-server-calculator"
# The same package's server, run over HTTP by this venv's mcp 2.x (--smoke, where DEFAULT_SERVER
# is not set up).
HOSTED_SERVER = shlex.join(
    [sys.executable, str(Path(__file__).with_name("_calculator_server.py")), "--http"]
)
SYSTEM_PROMPT = (
    "You solve arithmetic with the calculate tool: pass it the expression, e.g. 12*7. "
    "Then call complete_task with the number it returned."
)


@dataclass
class ArmResult:
    name: str
    val_before: float = 0.0
    val_after: float = 0.0
    steps: int = 0
    rollouts: int = 0
    groups_with_signal: int = 0
    groups_all_equal: int = 0
    never_solved: float = 0.0
    train_minutes: float = 0.0
    sft_minutes: float = 0.0
    step_rewards: list[float] = field(default_factory=list)
    # The adapter the arm ended with (the distill arm's teacher when it is dynamic+warm's).
    checkpoint: str | None = None
    # Each trained step's train/distill/kl (the distill arm).
    distill_kl: list[float] = field(default_factory=list)


def make_task(args: argparse.Namespace) -> tuple[Any, list[Any], list[Any]]:
    """The generator's dataset and the training / validation scenarios (disjoint)."""
    import art_mcp
    import reasoning_gym

    size = args.train_scenarios + args.val_scenarios
    # A procedural generator repeats itself (2-3 terms of <= 3 digits): draw twice as many
    # and keep the first of each question, so no scenario is in both splits or counted twice.
    dataset = reasoning_gym.create_dataset(
        args.dataset,
        size=2 * size,
        seed=args.seed,
        min_terms=args.min_terms,
        max_terms=args.max_terms,
        max_digits=args.max_digits,
        operators=tuple(args.operators),
    )
    scenarios, seen = [], set()
    for index, entry in enumerate(dataset):
        if entry["question"] in seen or len(scenarios) == size:
            continue
        seen.add(entry["question"])
        scenarios.append(
            art_mcp.Scenario(
                task=entry["question"],
                answer=str(entry["answer"]),
                metadata={"index": index, "expression": entry["metadata"].get("expression")},
            )
        )
    if len(scenarios) < size:
        raise SystemExit(f"the generator gave only {len(scenarios)} distinct questions of {size}")
    return dataset, scenarios[args.val_scenarios :], scenarios[: args.val_scenarios]


def verifier_reward(dataset: Any):
    """The generator's own verifier on the agent's final answer (1.0 = exact)."""

    def reward(scenario: Any, trajectory: Any) -> float:
        answer = trajectory.metadata.get("final_answer")
        entry = dataset[scenario.metadata["index"]]
        return float(dataset.score_answer(str(answer).strip() if answer else None, entry))

    return reward


async def demonstrations(
    server: str, scenarios: list[Any], settings: Any, errlog: Any = None
) -> list[Any]:
    """SFT traces: the ideal run of each scenario (calculate the expression, report the
    calculator's answer), with the real server's tool definitions and outputs."""
    import art_mcp

    import art_core as art

    traces = []
    async with art_mcp.connect(server, errlog=errlog) as session:
        toolset = art_mcp.ToolSet.from_mcp(
            session.tools,
            complete_task=True,
            strict=settings.strict_schemas,
            max_answer_chars=settings.max_answer_chars,
        )
        for scenario in scenarios:
            expression = scenario.metadata["expression"] or scenario.task
            output = await session.call_tool("calculate", {"expression": expression})
            messages = [
                {"role": "system", "content": settings.system_prompt},
                {"role": "user", "content": scenario.task},
                _tool_call("call_0", "calculate", {"expression": expression}),
                {"role": "tool", "tool_call_id": "call_0", "content": output.text},
                _tool_call("call_1", "complete_task", {"answer": scenario.answer}),
            ]
            traces.append(
                art.Trajectory(messages_and_choices=messages, tools=toolset.definitions, reward=1.0)
            )
    return traces


def _tool_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        ],
    }


async def validation_reward(
    model: Any, server: str, scenarios: list[Any], reward, args, settings
) -> float:
    import art_mcp

    groups = await art_mcp.validate(
        model,
        server,
        scenarios,
        reward_fn=reward,
        rollouts_per_scenario=args.val_runs,
        settings=settings,
        errlog=args.errlog,
        desc="validate",
    )
    rewards = [t.reward for g in groups for t in g.trajectories]
    return statistics.fmean(rewards) if rewards else 0.0


async def run_arm(
    name: str, args: argparse.Namespace, workdir: Path, teacher: str | None = None
) -> ArmResult:
    """One arm; ``teacher`` (the distill arm): the teacher's adapter folder."""
    import art_mcp

    import art_core as art

    dataset, train_set, val_set = make_task(args)
    reward = verifier_reward(dataset)
    settings = art_mcp.RolloutSettings(
        tool_choice="required",
        parallel_tool_calls=False,
        max_turns=3,
        max_tokens=args.max_tokens,
        max_answer_chars=40,
        system_prompt=SYSTEM_PROMPT,
    )
    result = ArmResult(name)
    distill = name == "distill"
    if distill and teacher is None:
        raise ValueError("the distill arm needs the teacher's adapter folder")
    config = art.TrainConfig(
        learning_rate=args.learning_rate,
        lora_rank=8,
        lora_alpha=16,
        seed=args.seed,
        # The distill arm: the same base model with the teacher's adapter scores the student's
        # sampled tokens; the reverse KL is added to the RL loss (rl=True).
        teacher=art.TeacherConfig(model=args.base_model, adapter=teacher, rl=True)
        if distill
        else None,
    )
    async with art.LocalBackend(path=workdir / name) as backend:
        model = art.TrainableModel(
            name=name.replace("+", "-"), project="sparse", base_model=args.base_model
        )
        await model.register(backend)
        result.val_before = await validation_reward(
            model, args.server, val_set, reward, args, settings
        )
        print(f"[{name}] validation before: {result.val_before:.3f}", flush=True)
        started = time.perf_counter()
        if name == "dynamic+warm":
            traces = await demonstrations(
                args.server, train_set[: args.sft_examples], settings, args.errlog
            )
            result.checkpoint = (await warm_start(model, traces, args)).checkpoint_path
            result.sft_minutes = (time.perf_counter() - started) / 60
            print(
                f"[{name}] warm start on {len(traces)} demonstrations: {result.sft_minutes:.1f} min"
            )
        dynamic = name in ("dynamic", "dynamic+warm")
        # The distill arm samples fixed groups, as plain does: dynamic sampling discards the
        # groups whose rewards are all equal before model.train sees them, and with a teacher
        # those still teach (the trainer keeps them for the distillation term, advantage 0).
        # Early on most groups are all zeros, so dynamic sampling would throw away most of
        # the teacher's signal and spend rollouts hunting for rare signal groups. The
        # curriculum only orders scenarios (it discards nothing), so it stays on.
        sampler = art.ScenarioSampler(
            train_set,
            lambda scenario: art_mcp.rollout(
                model,
                scenario,
                args.server,
                reward_fn=reward,
                settings=settings,
                errlog=args.errlog,
            ),
            group_size=args.rollouts_per_group,
            max_group_size=args.max_group_size if dynamic else None,
            dynamic_sampling=dynamic,
            curriculum=dynamic or distill,
            key=lambda scenario: scenario.id,
            seed=args.seed,
        )
        budget = args.minutes * 60
        plain_step = args.groups_per_step * args.rollouts_per_group
        while time.perf_counter() - started < budget and result.steps < args.max_steps:
            groups = await sampler.gather(
                args.groups_per_step,
                max_rollouts=args.max_rollouts_per_step if dynamic else plain_step,
                max_exceptions=0.25,
                pbar_desc=f"[{name}] step {result.steps} rollouts",
            )
            report = sampler.last_report
            assert report is not None
            trained = await model.train(groups, config=config)
            result.checkpoint = trained.checkpoint_path or result.checkpoint
            if "train/distill/kl" in trained.metrics:
                result.distill_kl.append(trained.metrics["train/distill/kl"])
            result.steps += 1
            result.rollouts += report.rollouts
            result.groups_with_signal += report.groups_with_signal
            result.groups_all_equal += report.groups_all_equal
            result.step_rewards.append(report.reward or 0.0)
            result.never_solved = report.scenarios.never_solved_share if report.scenarios else 0.0
        result.train_minutes = (time.perf_counter() - started) / 60
        result.val_after = await validation_reward(
            model, args.server, val_set, reward, args, settings
        )
        print(f"[{name}] validation after: {result.val_after:.3f}", flush=True)
    return result


async def warm_start(model: Any, traces: list[Any], args: argparse.Namespace) -> Any:
    """``model.train_sft`` on the demonstrations (the SFT warm start): its ``TrainResult``."""
    import art_core as art

    config_class = getattr(art, "SFTConfig", None)
    config = config_class(learning_rate=args.sft_learning_rate) if config_class else None
    return await model.train_sft(traces, config=config)


def check_warm_start_available() -> None:
    import art_core as art

    if not hasattr(art.TrainableModel, "train_sft"):
        raise SystemExit(
            "--warm-start needs TrainableModel.train_sft (the SFT warm start), which this "
            "art_core does not have yet: run without --warm-start"
        )


def teacher_line(results: list[ArmResult], args: argparse.Namespace) -> str:
    """Which teacher the distill arm learned from, and how good it is."""
    if args.teacher_adapter:
        return (
            f"distill teacher: {args.base_model} + {args.teacher_adapter} (--teacher-adapter; "
            "validation reward not measured here); its training time is not in the budget"
        )
    warm = next(r for r in results if r.name == "dynamic+warm")
    return (
        f"distill teacher: {args.base_model} + the dynamic+warm arm's final checkpoint "
        f"(validation reward {warm.val_after:.3f}); its training time is not in the budget"
    )


def print_table(results: list[ArmResult], args: argparse.Namespace) -> None:
    print(
        f"\nsparse rewards: {args.dataset} (reasoning-gym, its verifier), {args.base_model} + "
        f"mcp-server-calculator, {args.minutes:g} min per arm; {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores"
    )
    header = (
        f"{'arm':<14}{'val before':>11}{'val after':>10}{'change':>8}{'steps':>7}"
        f"{'rollouts':>10}{'signal':>8}{'all-equal':>10}{'never solved':>14}{'minutes':>9}"
        f"{'distill kl first/last':>23}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        kl = f"{r.distill_kl[0]:.3g} / {r.distill_kl[-1]:.3g}" if r.distill_kl else ""
        print(
            f"{r.name:<14}{r.val_before:>11.3f}{r.val_after:>10.3f}"
            f"{r.val_after - r.val_before:>+8.3f}{r.steps:>7}{r.rollouts:>10}"
            f"{r.groups_with_signal:>8}{r.groups_all_equal:>10}{r.never_solved:>14.0%}"
            f"{r.train_minutes:>9.1f}{kl:>23}"
        )
    if any(r.name == "distill" for r in results):
        print(teacher_line(results, args))
    plain = next((r for r in results if r.name == "plain"), None)
    warm = next((r for r in results if r.name == "dynamic+warm"), None)
    for r in results:
        if plain is not None and r is not plain:
            gain, base = r.val_after - r.val_before, plain.val_after - plain.val_before
            print(f"{r.name}: validation gain {gain:+.3f} vs plain {base:+.3f}")
    distilled = next((r for r in results if r.name == "distill"), None)
    if distilled is not None and warm is not None:
        print(
            f"distill: validation after {distilled.val_after:.3f} vs dynamic+warm "
            f"{warm.val_after:.3f} (same wall time; the SFT counted in dynamic+warm's)"
        )


ARMS = ("plain", "dynamic", "dynamic+warm", "distill")


async def run_arms(arms: list[str], args: argparse.Namespace, workdir: Path) -> list[ArmResult]:
    """The arms in order; the distill arm's teacher is ``--teacher-adapter`` or the final
    checkpoint of the dynamic+warm arm run before it."""
    results: list[ArmResult] = []
    for name in arms:
        teacher = None
        if name == "distill":
            teacher = args.teacher_adapter
            if teacher is None:
                warm = next(r for r in results if r.name == "dynamic+warm")
                if warm.checkpoint is None:
                    raise SystemExit("the dynamic+warm arm left no checkpoint to distill from")
                teacher = warm.checkpoint
            print(f"[distill] teacher: {args.base_model} + {teacher}", flush=True)
        results.append(await run_arm(name, args, workdir, teacher))
    return results


async def main(args: argparse.Namespace) -> None:
    arms = ["plain", "dynamic"] + (["dynamic+warm"] if args.warm_start else [])
    arms += ["distill"] if args.distill else []
    if args.arms:
        # A subset, in the usual order (distill learns from dynamic+warm's checkpoint).
        arms = [arm for arm in ARMS if arm in args.arms.split(",")]
    with tempfile.TemporaryDirectory(prefix="art-sparse-") as tmp:
        workdir = Path(args.path) if args.path else Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        with (workdir / "servers.log").open("a") as errlog:  # the MCP servers' stderr
            args.errlog = errlog
            if args.server == HOSTED_SERVER:
                import art_mcp

                async with art_mcp.spawn_http_server(HOSTED_SERVER, errlog=errlog) as server:
                    args.server = server
                    results = await run_arms(arms, args, workdir)
            else:
                results = await run_arms(arms, args, workdir)
    print_table(results, args)


def _parser() -> argparse.ArgumentParser:
    """The command line's options (``parse_args`` applies ``--smoke`` and checks them)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=20.0, help="training budget per arm")
    parser.add_argument("--max-steps", type=int, default=1_000_000, help="also stop after this")
    parser.add_argument("--base-model", default="smollm2-135m")
    parser.add_argument("--server", default=str(DEFAULT_SERVER), help="calculator server command")
    parser.add_argument("--path", default=None, help="keep the models here (default: a temp dir)")
    parser.add_argument("--dataset", default="basic_arithmetic", help="a reasoning-gym dataset")
    parser.add_argument("--min-terms", type=int, default=2)
    parser.add_argument("--max-terms", type=int, default=3)
    parser.add_argument("--max-digits", type=int, default=3)
    parser.add_argument("--operators", default="+-*", help="of + - * / (/ gives float answers)")
    parser.add_argument("--train-scenarios", type=int, default=64)
    parser.add_argument("--val-scenarios", type=int, default=16)
    parser.add_argument("--val-runs", type=int, default=2, help="runs per validation scenario")
    parser.add_argument("--groups-per-step", type=int, default=2)
    parser.add_argument("--rollouts-per-group", type=int, default=8)
    parser.add_argument("--max-group-size", type=int, default=24)
    parser.add_argument("--max-rollouts-per-step", type=int, default=96)
    parser.add_argument("--learning-rate", type=float, default=5e-4)
    parser.add_argument("--warm-start", action="store_true", help="add the dynamic+warm arm")
    parser.add_argument(
        "--distill",
        action="store_true",
        help="add the distill arm (on-policy distillation from --teacher-adapter, else from "
        "the dynamic+warm arm's final checkpoint: needs --warm-start)",
    )
    parser.add_argument(
        "--teacher-adapter",
        default=None,
        help="the distill arm's teacher: a LoRA checkpoint folder of --base-model",
    )
    parser.add_argument(
        "--arms",
        default=None,
        help="run only these arms, comma-separated (e.g. dynamic+warm,distill); the flags "
        "above still set what they need",
    )
    parser.add_argument("--sft-examples", type=int, default=32)
    parser.add_argument("--sft-learning-rate", type=float, default=2e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-tokens", type=int, default=48, help="per model call of a rollout")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny-random, every arm (--warm-start and --distill too) for 2 short steps "
        "(groups of 2, 24 tokens a call) on a few scenarios, one validation run: the same table",
    )
    return parser


def parse_args() -> argparse.Namespace:
    parser = _parser()
    args = parser.parse_args()
    print(machine_line(), flush=True)  # the figures below depend on it
    if args.smoke:
        args.base_model, args.warm_start, args.minutes, args.max_steps = "tiny-random", True, 1, 2
        args.distill = True
        args.train_scenarios, args.val_scenarios, args.val_runs, args.max_tokens = 8, 1, 1, 24
        args.groups_per_step, args.rollouts_per_group, args.max_group_size = 1, 2, 4
        args.max_rollouts_per_step, args.sft_examples = 4, 2
        if args.server == str(DEFAULT_SERVER) and not DEFAULT_SERVER.exists():
            args.server = HOSTED_SERVER
    if args.arms is not None:
        unknown = set(args.arms.split(",")) - set(ARMS)
        if unknown:
            parser.error(f"--arms: unknown {sorted(unknown)}; the arms are {', '.join(ARMS)}")
        wanted = args.arms.split(",")
        args.warm_start = args.warm_start or "dynamic+warm" in wanted
        args.distill = args.distill or "distill" in wanted
        if "distill" in wanted and "dynamic+warm" not in wanted and args.teacher_adapter is None:
            parser.error("--arms distill without dynamic+warm needs --teacher-adapter")
    if not set(args.operators) <= set("+-*/"):
        parser.error("--operators takes characters of + - * /")
    args.operators = list(args.operators)
    if args.warm_start:
        check_warm_start_available()
    if args.teacher_adapter is not None:
        adapter = Path(args.teacher_adapter).expanduser().resolve()
        if not (adapter / "adapter_config.json").is_file():
            parser.error(f"--teacher-adapter {adapter}: not a LoRA checkpoint folder")
        args.teacher_adapter = str(adapter)
    if args.distill and args.teacher_adapter is None and not args.warm_start:
        parser.error(
            "--distill needs a teacher: --teacher-adapter PATH (a LoRA checkpoint of "
            "--base-model), or --warm-start (the dynamic+warm arm's final checkpoint)"
        )
    if args.server == str(DEFAULT_SERVER) and not DEFAULT_SERVER.exists():
        parser.error("run `bash examples/mcp/setup_calculator.sh` first (or pass --server)")
    return args


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
