"""Real command-line agents (Codex CLI, Claude Code, opencode) trained with GRPO on a real
small model: what they solve before and after, and what a run costs.

For each agent of ``--agents`` (binaries from ``$ART_CLI_AGENTS_DIR/node_modules/.bin``,
default ``.art/cli-agents``, where ``bash run.sh test`` installs them), a fresh LoRA model on
Qwen2.5-Coder-0.5B-Instruct (``--base-model``; its GGUF is fetched once into the models
folder) is trained by ``art_cli_agents.train`` on the example tasks
(``examples/cli_agents/tasks``, ``--tasks``): ``--steps`` GRPO steps of ``--groups-per-step``
tasks x ``--n`` runs, sampled at ``--temperature`` with per-run seeds from ``--seed``, each run
bounded by ``--timeout`` seconds, ``--concurrent-groups`` groups at a time (1); the same
tasks, ``--n`` runs each, validate before the first step and after the last. Each agent uses
its small-model preset (a short system prompt naming its tools, answers capped at 512 tokens
and 3 turns for Claude Code and opencode);
``--own-prompts`` keeps the agents' own system prompts instead (2-5k tokens).

Per agent it reports:

- solve rate (share of runs with reward 1), per task and overall, before vs after training,
  overall with its 95% bootstrap interval (resampled by task, ``art_cli_agents.report``);
- prompt tokens per call: mean and max of the runs' first calls and of their later calls
  (every run of the benchmark: both validations and the training steps);
- prefill tokens asked vs computed per group, per phase (the engine's counters,
  ``prefill/tokens_asked`` and ``prefill/tokens_computed``, read at each phase's ends, divided
  by its groups), and "prompts per group": computed per group / asked per run, the number of
  runs' full prompts a group of ``--n`` runs costs (``--n`` with nothing shared, 1 when the
  runs share all they send; below 1 when the cache still holds an earlier phase's prompts
  for the same adapter); the prefix cache's hit rate;
- seconds per run (the agent's own time) and per step (rollouts + training);
- this process's peak RSS (so far: the models of the agents before stay loaded), the CPU,
  its cores, the dtype.

Baselines compared: each agent's solve rate before training vs after (same tasks, same
per-run seeds); each group's prefill computed vs asked (asked is what an engine without a
prefix cache computes: every run's whole prompt, the agents' long first prompts included).

It prints a table per agent and one across agents, and appends one JSON line per agent to
``benchmarks/results/cli_agents.jsonl`` (machine, date, settings, figures); ``--table`` prints
the README table from that file.

    python benchmarks/cli_agents.py                                  # all three, ~hours on CPU
    python benchmarks/cli_agents.py --agents opencode --steps 4 --n 6
    python benchmarks/cli_agents.py --agents claude --own-prompts
    python benchmarks/cli_agents.py --table
    python benchmarks/cli_agents.py --smoke    (tiny-qwen2.5, a stand-in agent, ~1 min)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from statistics import fmean
from typing import Any

from _machine import machine_line

from art_core.cpu import cpu_model

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "cli_agents.jsonl"
TASKS = ROOT / "examples" / "cli_agents" / "tasks"
AGENTS = ("codex", "claude", "opencode")
NPM_NAMES = {"codex": "codex", "claude": "claude", "opencode": "opencode"}
# The phases whose engine counters are read, in order.
PHASES = ("validation before", "training", "validation after")

# --smoke's agent: two chat calls to the run's gateway (the second a later turn, sent with
# the first's answer), as a real agent reads its URL, key and model from the environment. It
# changes no file, so its checks fail: every path of the benchmark, no learning claimed.
# (No dollar sign in it: agent arguments are templates.)
STAND_IN_AGENT = """
import os, sys
from openai import OpenAI
client = OpenAI()
model = os.environ["OPENAI_MODEL"]
messages = [
    {"role": "system", "content": "You are a coding agent in the current folder."},
    {"role": "user", "content": sys.argv[1]},
]
first = client.chat.completions.create(model=model, messages=messages, max_tokens=8)
messages += [
    {"role": "assistant", "content": first.choices[0].message.content or ""},
    {"role": "user", "content": "Go on."},
]
client.chat.completions.create(model=model, messages=messages, max_tokens=8)
"""


def npm_binary(name: str) -> str:
    """An npm agent's binary under ``$ART_CLI_AGENTS_DIR/node_modules/.bin``; exits naming
    the folder when it is not there."""
    folder = Path(os.environ.get("ART_CLI_AGENTS_DIR", ".art/cli-agents")) / "node_modules" / ".bin"
    path = folder / name
    if not path.exists():
        raise SystemExit(
            f"{name} is not in {folder}: `bash run.sh test` installs the npm agents there "
            "(or set ART_CLI_AGENTS_DIR to where they are)"
        )
    return str(path.absolute())


def make_agent(choice: str, *, own_prompts: bool) -> Any:
    """The agent ``choice`` names, with its small-model preset (or its own prompts)."""
    import art_cli_agents as cli

    if choice == "stand-in":
        return cli.CLIAgent("stand-in", [sys.executable, "-c", STAND_IN_AGENT, "${prompt}"])
    binary = npm_binary(NPM_NAMES[choice])
    if choice == "codex":
        return cli.codex(
            binary, system_prompt=None if own_prompts else cli.CODEX_SMALL_MODEL_PROMPT
        )
    if choice == "claude":
        return cli.claude_code(
            binary,
            max_output_tokens=512,
            system_prompt=None if own_prompts else cli.CLAUDE_CODE_SMALL_MODEL_PROMPT,
            max_turns=3,
        )
    return cli.opencode(
        binary,
        max_output_tokens=512,
        system_prompt=None if own_prompts else cli.OPENCODE_SMALL_MODEL_PROMPT,
        max_turns=3,
    )


# ------------------------------------------------------------------------------- measuring


@dataclass
class Phase:
    """One phase's engine counters (differences) and its groups and runs."""

    groups: int = 0
    runs: int = 0
    asked: float = 0.0
    computed: float = 0.0
    cache_asked: float = 0.0
    cache_hit: float = 0.0

    def figures(self) -> dict[str, float | int | None]:
        per_group = self.groups or 1
        asked_per_run = self.asked / self.runs if self.runs else 0.0
        return {
            "groups": self.groups,
            "runs": self.runs,
            "asked": self.asked,
            "computed": self.computed,
            "asked_per_group": self.asked / per_group,
            "computed_per_group": self.computed / per_group,
            # How many runs' full prompts a group costs (n with nothing shared, ~1 all shared).
            "prompts_per_group": (self.computed / per_group) / asked_per_run
            if asked_per_run
            else None,
            "cache_hit_rate": self.cache_hit / self.cache_asked if self.cache_asked else None,
        }


COUNTERS = {
    "asked": "prefill/tokens_asked",
    "computed": "prefill/tokens_computed",
    "cache_asked": "prefix_cache/tokens_asked",
    "cache_hit": "prefix_cache/tokens_hit",
}


class Recorder:
    """What one agent's training run did, read as it goes: the groups of every validation
    and step (their calls), and the engine's counters at each phase's end."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.val_groups: list[list[Any]] = []
        self.train_groups: list[Any] = []
        self.phases = {name: Phase() for name in PHASES}
        self.counting = bool(self.read())
        self._last = self.read()

    def read(self) -> dict[str, float]:
        metrics = getattr(self.engine, "metrics", None)
        values = metrics() if callable(metrics) else {}
        return {k: float(values[key]) for k, key in COUNTERS.items() if key in values}

    def end_phase(self, name: str, groups: int, runs: int) -> None:
        """Add the counters since the previous phase's end to ``name``."""
        now = self.read()
        phase = self.phases[name]
        phase.groups += groups
        phase.runs += runs
        for key, value in now.items():
            setattr(phase, key, getattr(phase, key) + value - self._last.get(key, 0.0))
        self._last = now

    def on_val(self, groups: Sequence[Any]) -> None:
        self.val_groups.append(list(groups))
        name = PHASES[0] if len(self.val_groups) == 1 else PHASES[2]
        self.end_phase(name, len(groups), _runs(groups))

    def on_step(self, record: Any) -> None:
        # Training itself computes no prefill in the engine: the step's counters are its runs'.
        self.end_phase(PHASES[1], record.groups, record.rollouts + record.failed)


def _runs(groups: Sequence[Any]) -> int:
    """Runs started: those that returned and those that raised."""
    return sum(len(g.trajectories) + len(g.exceptions) for g in groups)


def measured_model_class() -> type:
    """``art.TrainableModel`` that hands ``train``'s validation and training groups to its
    recorder (``cli.train`` returns summaries, not the runs' calls)."""
    from pydantic import PrivateAttr

    import art_core as art

    class MeasuredModel(art.TrainableModel):  # type: ignore[misc]
        _recorder: Recorder | None = PrivateAttr(default=None)

        async def log(self, trajectories: Any = None, split: str = "val", **kwargs: Any) -> None:
            if self._recorder is not None and split == "val" and trajectories is not None:
                trajectories = list(trajectories)
                self._recorder.on_val(trajectories)
            await super().log(trajectories, split, **kwargs)

        async def train(self, trajectory_groups: Any, *args: Any, **kwargs: Any) -> Any:
            trajectory_groups = list(trajectory_groups)
            if self._recorder is not None:
                self._recorder.train_groups += trajectory_groups
            return await super().train(trajectory_groups, *args, **kwargs)

    return MeasuredModel


def _spread(values: Sequence[float]) -> dict[str, float | int | None]:
    return {
        "mean": fmean(values) if values else None,
        "max": max(values) if values else None,
        "calls": len(values),
    }


def _estimate(value: Any) -> dict[str, float] | None:
    return None if value is None else {"value": value.value, "low": value.low, "high": value.high}


def _solved_by_task(groups: Sequence[Any]) -> dict[str, dict[str, int]]:
    # art_core is imported where it is used: ``--table`` reads a JSON file and needs none of it.
    from art_core.evals.before_after import SOLVED_AT

    out: dict[str, dict[str, int]] = {}
    for g in groups:
        name = str(g.metadata.get("task", "?"))
        entry = out.setdefault(name, {"solved": 0, "runs": 0, "raised": 0})
        entry["solved"] += sum(t.reward >= SOLVED_AT for t in g.trajectories)
        entry["runs"] += len(g.trajectories)
        entry["raised"] += len(g.exceptions)
    return out


def _peak_rss_mib() -> float:
    """This process's peak resident set size so far, in MiB (the agents' processes are not
    counted: a child's figure includes the parent's pages it was forked with)."""
    # ru_maxrss is in KiB on Linux, in bytes on macOS.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


@dataclass
class AgentResult:
    agent: str
    base_model: str
    dtype: str
    prompts: str
    machine: str
    cpu: str
    cores: int
    cores_usable: int
    date: str
    settings: dict[str, Any]
    solved_before: dict[str, float] | None = None
    solved_after: dict[str, float] | None = None
    mean_reward_before: float = 0.0
    mean_reward_after: float = 0.0
    per_task_before: dict[str, dict[str, int]] = field(default_factory=dict)
    per_task_after: dict[str, dict[str, int]] = field(default_factory=dict)
    prompt_tokens_first: dict[str, Any] = field(default_factory=dict)
    prompt_tokens_later: dict[str, Any] = field(default_factory=dict)
    calls_per_run: float = 0.0
    prefill: dict[str, dict[str, Any]] = field(default_factory=dict)
    seconds_per_run: float | None = None
    seconds_per_step: float | None = None
    rollout_s_per_step: float | None = None
    train_s_per_step: float | None = None
    wall_s: float = 0.0
    steps: list[dict[str, Any]] = field(default_factory=list)
    peak_rss_mib: float = 0.0


async def run_agent(
    choice: str, args: argparse.Namespace, backend: Any, base_model: str, tasks: list[Any]
) -> AgentResult:
    """Train a fresh model with agent ``choice``; its figures."""
    import art_cli_agents as cli

    import art_core as art

    agent = make_agent(choice, own_prompts=args.own_prompts)
    # A fresh model each time, even in a kept --path (a name seen there would resume).
    name = f"{choice}-{time.strftime('%Y%m%d-%H%M%S')}"
    model = measured_model_class()(name=name, project="cli-agents-bench", base_model=base_model)
    await model.register(backend)
    recorder = Recorder(backend.engine(model))
    model._recorder = recorder
    precision = {"bfloat16": "bf16", "float32": "fp32"}.get(args.dtype, "auto")
    started = time.perf_counter()
    report = await cli.train(
        model,
        agent,
        tasks,
        val_tasks=tasks,
        steps=args.steps,
        groups_per_step=args.groups_per_step,
        rollouts_per_group=args.n,
        val_rollouts_per_task=args.n,
        config=art.TrainConfig(
            learning_rate=args.learning_rate,
            precision=precision,
            max_tokens_per_batch=args.max_tokens_per_batch,
            gradient_checkpointing=True,
        ),
        limits=cli.Limits(timeout_s=args.timeout),
        max_concurrent_groups=args.concurrent_groups,
        seed=args.seed,
        sampling=art.RolloutSampling(seed=args.seed, temperature=args.temperature),
        errlog=sys.stderr,
        on_step=recorder.on_step,
    )
    wall = time.perf_counter() - started
    print(report.table(), flush=True)

    groups = [g for pass_ in recorder.val_groups for g in pass_] + recorder.train_groups
    runs = [t for g in groups for t in g.trajectories]
    first = [float(t.calls[0].num_prompt_tokens) for t in runs if t.calls]
    later = [float(c.num_prompt_tokens) for t in runs for c in t.calls[1:]]
    step_s = [r.rollout_s + r.train_s for r in report.steps]
    return AgentResult(
        agent=agent.name,
        base_model=args.base_model_label,
        dtype=args.dtype,
        prompts="own" if args.own_prompts else "small-model",
        machine=machine_line().removeprefix("machine: "),
        cpu=cpu_model(),
        cores=os.cpu_count() or 0,
        cores_usable=args.cores_usable,
        date=date.today().isoformat(),
        settings={
            "tasks": [str(t.metadata.get("task", "?")) for t in tasks],
            "steps": args.steps,
            "groups_per_step": args.groups_per_step,
            "n": args.n,
            "temperature": args.temperature,
            "seed": args.seed,
            "timeout_s": args.timeout,
            "concurrent_groups": args.concurrent_groups,
            "max_tokens_per_batch": args.max_tokens_per_batch,
            "learning_rate": args.learning_rate,
            "smoke": args.smoke,
        },
        solved_before=_estimate(report.before.solved_interval()),
        solved_after=_estimate(report.after.solved_interval()),
        mean_reward_before=report.before.mean_reward,
        mean_reward_after=report.after.mean_reward,
        per_task_before=_solved_by_task(recorder.val_groups[0] if recorder.val_groups else []),
        per_task_after=_solved_by_task(recorder.val_groups[-1] if recorder.val_groups else []),
        prompt_tokens_first=_spread(first),
        prompt_tokens_later=_spread(later),
        calls_per_run=fmean(len(t.calls) for t in runs) if runs else 0.0,
        prefill={name: phase.figures() for name, phase in recorder.phases.items()}
        if recorder.counting
        else {},
        seconds_per_run=fmean(float(t.metrics.get("agent_seconds", 0.0)) for t in runs)
        if runs
        else None,
        seconds_per_step=fmean(step_s) if step_s else None,
        rollout_s_per_step=fmean(r.rollout_s for r in report.steps) if report.steps else None,
        train_s_per_step=fmean(r.train_s for r in report.steps) if report.steps else None,
        wall_s=wall,
        steps=[
            {
                "step": r.step,
                "reward": r.reward,
                "trained": r.trained,
                "groups_with_signal": r.groups_with_signal,
                "groups": r.groups,
            }
            for r in report.steps
        ],
        peak_rss_mib=_peak_rss_mib(),
    )


# ------------------------------------------------------------------------------- printing


def _pct(value: dict[str, float] | None) -> str:
    if value is None:
        return "no runs"
    return f"{value['value']:.1%} [{value['low']:.1%}, {value['high']:.1%}]"


def _num(value: float | None, spec: str = ".0f") -> str:
    return "n/a" if value is None else format(value, spec)


def _task_cell(entry: dict[str, int] | None) -> str:
    if not entry or not entry["runs"]:
        return "no runs"
    text = f"{entry['solved']}/{entry['runs']} ({entry['solved'] / entry['runs']:.0%})"
    return text + (f", {entry['raised']} raised" if entry["raised"] else "")


def agent_table(r: AgentResult) -> str:
    """The figures of one agent, as plain text."""
    rows: list[tuple[str, str, str]] = []
    for name in r.settings["tasks"]:
        before, after = r.per_task_before.get(name), r.per_task_after.get(name)
        rows.append((f"  solved: {name}", _task_cell(before), _task_cell(after)))
    rows.append(("  solved: all tasks", _pct(r.solved_before), _pct(r.solved_after)))
    rows.append(("  mean reward", f"{r.mean_reward_before:.3f}", f"{r.mean_reward_after:.3f}"))
    width = max(len(c) for row in rows for c in row[1:])
    s = r.settings
    lines = [
        f"agent {r.agent}: {r.base_model} ({r.dtype}), {r.prompts} prompts; {s['steps']} steps "
        f"x {s['groups_per_step']} groups x {s['n']} runs, temperature {s['temperature']}",
        f"{'':<27}  {'before':>{width}}  {'after':>{width}}",
        *(f"{a:<27}  {b:>{width}}  {c:>{width}}" for a, b, c in rows),
        "  [low, high]: 95% bootstrap intervals, resampled by task",
        "",
        f"prompt tokens, first calls   mean {_num(r.prompt_tokens_first['mean'])}, max "
        f"{_num(r.prompt_tokens_first['max'])} ({r.prompt_tokens_first['calls']} calls)",
        f"prompt tokens, later calls   mean {_num(r.prompt_tokens_later['mean'])}, max "
        f"{_num(r.prompt_tokens_later['max'])} ({r.prompt_tokens_later['calls']} calls); "
        f"{r.calls_per_run:.2f} calls per run",
    ]
    if r.prefill:
        lines += [
            "",
            f"{'prefill per group':<18} {'groups':>6} {'asked':>9} {'computed':>9} "
            f"{'prompts/group':>13} {'cache hits':>10}",
        ]
        for name, p in r.prefill.items():
            hit = p["cache_hit_rate"]
            lines.append(
                f"{name:<18} {p['groups']:>6} {p['asked_per_group']:>9.0f} "
                f"{p['computed_per_group']:>9.0f} {_num(p['prompts_per_group'], '.2f'):>13} "
                f"{_num(None if hit is None else 100 * hit, '.1f') + '%':>10}"
            )
        lines.append(
            f"  prompts/group: computed per group / asked per run ({s['n']} with nothing "
            "shared, 1 when a group's runs share all they send; below 1 when the cache "
            "still holds what earlier groups sent, for the same adapter)"
        )
    else:
        lines += ["", "prefill: this engine has no prefill counters"]
    lines += [
        "",
        f"seconds per run {_num(r.seconds_per_run, '.1f')}; per step "
        f"{_num(r.seconds_per_step, '.1f')} (rollouts {_num(r.rollout_s_per_step, '.1f')} + "
        f"train {_num(r.train_s_per_step, '.1f')}); whole run {r.wall_s / 60:.1f} min",
        f"peak RSS of this process (so far: every agent's model stays loaded) "
        f"{r.peak_rss_mib:.0f} MiB",
    ]
    return "\n".join(lines)


def _prompts_per_group(r: dict[str, Any]) -> str:
    training = (r.get("prefill") or {}).get("training") or {}
    return _num(training.get("prompts_per_group"), ".2f")


def summary_table(results: Sequence[AgentResult]) -> str:
    """One line per agent."""
    head = (
        f"{'agent':<12} {'solved before':>22} {'solved after':>22} {'1st call tok':>12} "
        f"{'later tok':>10} {'prompts/grp':>11} {'s/run':>6} {'s/step':>7} {'RSS MiB':>8}"
    )
    lines = [head]
    for r in results:
        lines.append(
            f"{r.agent:<12} {_pct(r.solved_before):>22} {_pct(r.solved_after):>22} "
            f"{_num(r.prompt_tokens_first['mean']):>12} {_num(r.prompt_tokens_later['mean']):>10} "
            f"{_prompts_per_group(r.__dict__):>11} {_num(r.seconds_per_run, '.1f'):>6} "
            f"{_num(r.seconds_per_step, '.1f'):>7} {r.peak_rss_mib:>8.0f}"
        )
    lines.append(
        "tok: mean prompt tokens per call; prompts/grp: prefill computed per training group "
        "/ asked per run"
    )
    return "\n".join(lines)


def table(path: Path = RESULTS) -> str:
    """The README table: every recorded agent run, in the order run."""
    lines = [
        "| agent | model (dtype) | prompts | steps x groups x runs | solved before | solved after "
        "| prompt tokens, 1st call (max) | later calls (max) | prompts per group | s per run "
        "| s per step | peak RSS | machine, date |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for raw in path.read_text().splitlines() if path.exists() else []:
        if not raw.strip():
            continue
        r = json.loads(raw)
        s, first, later = r["settings"], r["prompt_tokens_first"], r["prompt_tokens_later"]
        after = r["solved_after"]
        bold = (
            "**"
            if after and r["solved_before"] and after["low"] > r["solved_before"]["high"]
            else ""
        )
        lines.append(
            f"| {r['agent']} | {Path(r['base_model']).name} ({r['dtype']}) | {r['prompts']} | "
            f"{s['steps']} x {s['groups_per_step']} x {s['n']} | {_pct(r['solved_before'])} | "
            f"{bold}{_pct(after)}{bold} | {_num(first['mean'])} ({_num(first['max'])}) | "
            f"{_num(later['mean'])} ({_num(later['max'])}) | {_prompts_per_group(r)} | "
            f"{_num(r['seconds_per_run'], '.1f')} | {_num(r['seconds_per_step'], '.0f')} | "
            f"{r['peak_rss_mib']:.0f} MiB | {r['machine']}, {r['date']} |"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------------- main


def default_dtype() -> str:
    """bfloat16 where the hardware computes it natively, else float32 (the engine's own
    choice: ``art_core.device.serving_dtype``)."""
    from art_core.device import choose_device, serving_dtype

    return str(serving_dtype(choose_device())).removeprefix("torch.")


def resolve_model(args: argparse.Namespace) -> str:
    """The base model's local folder: Qwen2.5-Coder-0.5B-Instruct's GGUF fetched and
    converted once into the models folder, or what ``--base-model`` names."""
    from art_core.embedded import models_dir, resolve_base_model

    name = args.base_model
    if name is None:
        from art_core.embedded.qwen_gguf import fetch_qwen25_coder

        name = str(fetch_qwen25_coder(models_dir()))
    args.base_model_label = Path(name).stem if name.endswith(".gguf") else name
    if name.startswith("tiny-"):  # built in a moment where the backend keeps its models
        return name
    return str(resolve_base_model(name))


async def main(args: argparse.Namespace) -> int:
    import art_cli_agents as cli

    from art_core.cpu import cpu_budget

    # Every binary found before any model loads.
    for choice in args.agents:
        make_agent(choice, own_prompts=args.own_prompts)
    tasks = cli.load_tasks(args.tasks)
    if args.smoke:
        tasks = tasks[:2]
    base_model = resolve_model(args)
    args.cores_usable = cpu_budget()
    print(
        f"CPU: {cpu_model()}, {os.cpu_count()} cores ({args.cores_usable} usable); dtype "
        f"{args.dtype}{' (default for this machine)' if args.dtype_default else ''}; base model "
        f"{args.base_model_label}; agents {', '.join(args.agents)}; {len(tasks)} tasks",
        flush=True,
    )
    results: list[AgentResult] = []
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="art-bench-cli-") as tmp:
        path = Path(args.path) if args.path else Path(tmp)
        async with cli_backend(path, args.dtype) as backend:
            for choice in args.agents:
                print(f"\n=== {choice} ===", flush=True)
                try:
                    result = await run_agent(choice, args, backend, base_model, tasks)
                except Exception as exc:  # the other agents still run
                    traceback.print_exc()
                    print(f"{choice} failed: {type(exc).__name__}: {exc}", flush=True)
                    failed.append(choice)
                    continue
                results.append(result)
                print("\n" + agent_table(result), flush=True)
                args.results.parent.mkdir(parents=True, exist_ok=True)
                with args.results.open("a") as out:
                    out.write(json.dumps(result.__dict__) + "\n")
    if results:
        print("\n" + summary_table(results))
        print(f"\nappended to {args.results}")
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


def cli_backend(path: Path, dtype: str) -> Any:
    import art_core as art

    # The engine's default batch (32 rows) holds a validation pass of 4 tasks x 8 runs; more
    # rows of 5-9k-token prompts would hold gigabytes of KV cache on a CPU.
    return art.LocalBackend(path=path, dtype=dtype)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--agents", default=",".join(AGENTS), help="comma-separated: codex,claude,opencode"
    )
    parser.add_argument(
        "--base-model",
        default=None,
        help="a model name, folder or GGUF path (default: Qwen2.5-Coder-0.5B-Instruct's GGUF)",
    )
    parser.add_argument("--dtype", default=None, help="bfloat16 | float32 (default: the CPU's)")
    parser.add_argument("--tasks", default=str(TASKS), help="a folder of tasks")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--groups-per-step", type=int, default=2)
    parser.add_argument("--n", type=int, default=8, help="runs per group, and per task to validate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per run")
    parser.add_argument(
        "--concurrent-groups",
        type=int,
        default=1,
        help="groups whose runs go at once (default 1: a group's runs together, groups one "
        "after another, so a run's time limit is not spent waiting for other groups' calls)",
    )
    parser.add_argument(
        "--max-tokens-per-batch",
        type=int,
        default=8192,
        help="a micro-batch's token budget (TrainConfig; default 8192 with recomputed "
        "activations: a group of 8 runs and its 2-3k-token shared prompt in one row)",
    )
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument(
        "--own-prompts",
        action="store_true",
        help="the agents' own system prompts, not the small-model presets",
    )
    parser.add_argument("--path", default=None, help="keep the backend's files here (temp)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the JSON lines file")
    parser.add_argument("--table", action="store_true", help="print the README table and exit")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny-qwen2.5, a stand-in agent, 2 tasks, 1 step of 2 runs: every path, "
        "recorded in a temporary file",
    )
    args = parser.parse_args(argv)
    if args.table:
        return args
    args.agents = [a.strip() for a in args.agents.split(",") if a.strip()]
    if args.smoke:
        args.agents, args.base_model = ["stand-in"], "tiny-qwen2.5"
        args.steps, args.groups_per_step, args.n, args.timeout = 1, 1, 2, 60.0
        args.results = Path(tempfile.mkdtemp(prefix="art-bench-cli-smoke-")) / "cli_agents.jsonl"
    else:
        unknown = [a for a in args.agents if a not in AGENTS]
        if unknown or not args.agents:
            parser.error(
                f"--agents: {', '.join(unknown) or 'none'}; choose from {', '.join(AGENTS)}"
            )
    if min(args.steps, args.groups_per_step, args.concurrent_groups) < 1:
        parser.error("--steps, --groups-per-step and --concurrent-groups must be at least 1")
    if args.n < 2:
        parser.error("--n must be at least 2 (GRPO compares a task's runs)")
    args.dtype_default = args.dtype is None
    args.dtype = args.dtype or default_dtype()
    return args


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.table:
        print(table(arguments.results))
        sys.exit(0)
    print(machine_line(), flush=True)  # the figures below depend on it
    code = asyncio.run(main(arguments))
    if arguments.smoke:
        print("\n" + table(arguments.results))
        shutil.rmtree(arguments.results.parent, ignore_errors=True)
    sys.exit(code)
