"""Train a model to use a real third-party MCP server from PyPI: ``mcp-server-time``.

The server (stdio, one process per rollout) has ``get_current_time(timezone)`` and
``convert_time(...)``. The tasks ask for the time in a city; the reward is checked by a
program: the model must call ``get_current_time`` with the city's IANA timezone (0.5) and
report the time it got back (1.0). With ``--judge-model`` RULER scores the runs instead, and
with ``--generate N`` an LLM writes the tasks (RULER is then needed: they have no answers).

    python examples/mcp/time_agent.py                       # 2 small steps on smollm2-135m
    python examples/mcp/time_agent.py --steps 10 --groups-per-step 4 --rollouts-per-group 8
    python examples/mcp/time_agent.py --judge-model gpt-4.1 --generate 24 --generator-model gpt-4.1
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time

import art_mcp

import art_core as art

SERVER = "mcp-server-time --local-timezone Etc/UTC"
CITIES = {
    "Tokyo": "Asia/Tokyo",
    "Paris": "Europe/Paris",
    "London": "Europe/London",
    "New York": "America/New_York",
    "Sydney": "Australia/Sydney",
    "Lima": "America/Lima",
    "Berlin": "Europe/Berlin",
    "Chicago": "America/Chicago",
}
SYSTEM_PROMPT = (
    "You answer questions about time with the tools. Timezones are IANA names such as "
    "Europe/Madrid. When you have the answer, call complete_task with it."
)


def city_scenarios() -> list[art_mcp.Scenario]:
    """One task per city; the expected timezone is kept in the scenario's metadata."""
    return [
        art_mcp.Scenario(
            task=f"What time is it in {city} right now?", difficulty=1, metadata={"timezone": zone}
        )
        for city, zone in CITIES.items()
    ]


def time_reward(scenario: art_mcp.Scenario, trajectory: art.Trajectory) -> float:
    """1.0: the final answer gives the HH:MM the tool returned for the right timezone.
    Otherwise 0.3 for looking the right timezone up (0.1 for another successful tool call)
    plus 0.2 for giving a final answer at all (as ``art_mcp.answer_reward`` does)."""
    zone = scenario.metadata["timezone"]
    looked_up = any(
        name == "get_current_time" and args.get("timezone") == zone
        for name, args in art_mcp.tool_calls(trajectory)
    )
    results = art_mcp.tool_results(trajectory)
    times = [
        m.group(1)
        for r in results
        if f'"timezone": "{zone}"' in r
        for m in [re.search(r'"datetime": "\d{4}-\d\d-\d\dT(\d\d:\d\d)', r)]
        if m
    ]
    answer = trajectory.metadata.get("final_answer") or ""
    if looked_up and any(t in answer for t in times):
        return 1.0
    score = 0.3 if looked_up else 0.1 if any(not r.startswith("Error") for r in results) else 0.0
    return score + (0.2 if answer.strip() else 0.0)


async def main(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    async with art_mcp.connect(SERVER) as session:
        print("tools:", [t.name for t in session.tools])
    if args.generate:
        scenarios = await art_mcp.generate_scenarios(
            SERVER,
            args.generate,
            generator_model=args.generator_model,
            generator_base_url=args.generator_base_url,
        )
        art_mcp.save_scenarios(scenarios, "time_scenarios.jsonl")
        print(f"generated {len(scenarios)} tasks -> time_scenarios.jsonl")
    else:
        scenarios = city_scenarios()
    judge = (
        art_mcp.Judge(model=args.judge_model, base_url=args.judge_base_url)
        if args.judge_model
        else None
    )
    if judge is None and args.generate:
        raise SystemExit("generated tasks have no checkable answer: add --judge-model (RULER)")
    settings = art_mcp.RolloutSettings(
        tool_choice="required",
        parallel_tool_calls=False,
        max_turns=3,
        max_tokens=64,
        max_answer_chars=80,
        system_prompt=SYSTEM_PROMPT,
    )
    async with art.LocalBackend(path=args.path) as backend:
        model = art.TrainableModel(name=args.name, project="mcp-time", base_model=args.base_model)
        await model.register(backend)
        report = await art_mcp.train(
            model,
            SERVER,
            scenarios,
            steps=args.steps,
            groups_per_step=args.groups_per_step,
            rollouts_per_group=args.rollouts_per_group,
            reward_fn=None if judge else time_reward,
            judge=judge,
            val_scenarios=scenarios[:4],
            val_rollouts_per_scenario=2,
            settings=settings,
            config=art.TrainConfig(learning_rate=args.learning_rate, lora_rank=8, lora_alpha=16),
        )
    for record in report.steps:
        print(f"step {record.step}: reward {record.reward:.3f} ({record.rollouts} runs)")
    print(report.table())
    print(f"wall time {(time.perf_counter() - started) / 60:.1f} min")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base-model", default="smollm2-135m")
    parser.add_argument("--name", default="time-agent")
    parser.add_argument("--path", default=".art")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--groups-per-step", type=int, default=2)
    parser.add_argument("--rollouts-per-group", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=5e-4)
    parser.add_argument("--judge-model", default=None)
    parser.add_argument("--judge-base-url", default=None)
    parser.add_argument("--generate", type=int, default=0, help="LLM-written tasks (needs a judge)")
    parser.add_argument("--generator-model", default="gpt-4.1")
    parser.add_argument("--generator-base-url", default=None)
    asyncio.run(main(parser.parse_args()))
