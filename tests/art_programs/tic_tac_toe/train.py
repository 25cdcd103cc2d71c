import argparse
import asyncio
import os

import art
from art.local import LocalBackend
from rollout import TicTacToeScenario, rollout

STEPS = int(os.environ.get("ART_PROGRAM_STEPS", "30"))
ROLLOUTS = int(os.environ.get("ART_PROGRAM_ROLLOUTS", "48"))


async def main(backend_name: str) -> None:
    if backend_name != "local":
        raise SystemExit("only the local backend is set up in this program")
    backend = LocalBackend()
    model = art.TrainableModel(
        name="ttt-agent",
        project="tic-tac-toe",
        base_model=os.environ.get("ART_PROGRAM_BASE_MODEL", "Qwen/Qwen2.5-7B-Instruct"),
    )
    print("registering")
    await model.register(backend)
    for step in range(await model.get_step(), STEPS):
        groups = await art.gather_trajectory_groups(
            [
                art.TrajectoryGroup(
                    rollout(model, TicTacToeScenario(step=step)) for _ in range(ROLLOUTS)
                )
            ],
            pbar_desc="gather",
        )
        print("training")
        await model.train(groups, config=art.TrainConfig(learning_rate=1e-2))
    await backend.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="local")
    asyncio.run(main(parser.parse_args().backend))
