import asyncio
import os
from dataclasses import dataclass

import art
from art.local import LocalBackend

STEPS = int(os.environ.get("ART_PROGRAM_STEPS", "10"))


@dataclass
class Scenario:
    question: str


SCENARIOS = [Scenario("Name a colour."), Scenario("Name a fruit.")]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        },
    }
]


async def rollout(model: art.TrainableModel, scenario: Scenario) -> art.Trajectory:
    client = model.openai_client()
    trajectory = art.Trajectory(
        messages_and_choices=[
            {"role": "system", "content": "Answer in a few words."},
            {"role": "user", "content": scenario.question},
        ],
        tools=TOOLS,
        reward=0,
    )
    completion = await client.chat.completions.create(
        model=model.get_inference_name(),
        messages=trajectory.messages(),
        tools=TOOLS,
        max_completion_tokens=24,
    )
    choice = completion.choices[0]
    trajectory.messages_and_choices.append(choice)
    # A score the task defines; here, one that differs between runs.
    trajectory.reward = len(choice.message.content or "") % 7
    return trajectory


async def main() -> None:
    backend = LocalBackend()
    model = art.TrainableModel(
        name="agent-001",
        project="my-agentic-task",
        base_model=os.environ.get("ART_PROGRAM_BASE_MODEL", "Qwen/Qwen2.5-14B-Instruct"),
    )
    await model.register(backend)
    for _ in range(await model.get_step(), STEPS):
        train_groups = await art.gather_trajectory_groups(
            (art.TrajectoryGroup(rollout(model, s) for _ in range(8)) for s in SCENARIOS),
            pbar_desc="gather",
        )
        print("num train groups:", len(train_groups))
        print("length of each train group:", len(train_groups[0].trajectories))
        await model.train(train_groups, config=art.TrainConfig(learning_rate=1e-4))
    # ART 0.5's backend-first loop: train, then log the step's metrics.
    train_groups = await art.gather_trajectory_groups(
        art.TrajectoryGroup(rollout(model, s) for _ in range(8)) for s in SCENARIOS
    )
    result = await backend.train(model, train_groups, learning_rate=1e-4)
    await model.log(train_groups, metrics=result.metrics, step=result.step, split="train")
    await backend.close()


if __name__ == "__main__":
    asyncio.run(main())
