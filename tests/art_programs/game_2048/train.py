import asyncio
import os
import random

import art
from art.local import LocalBackend
from rollout import rollout

random.seed(0)

model = art.TrainableModel(
    name="agent-2048",
    project="2048",
    base_model=os.environ.get("ART_PROGRAM_BASE_MODEL", "Qwen/Qwen2.5-3B-Instruct"),
)
model._internal_config = art.dev.InternalModelConfig(
    init_args=art.dev.InitArgs(max_seq_length=4096),
    engine_args=art.dev.EngineArgs(enforce_eager=True, gpu_memory_utilization=0.8),
)
STEPS = int(os.environ.get("ART_PROGRAM_STEPS", "20"))
ROLLOUTS = int(os.environ.get("ART_PROGRAM_ROLLOUTS", "16"))


async def main() -> None:
    backend = LocalBackend()
    await model.register(backend)
    for i in range(await model.get_step(), STEPS):
        train_groups = await art.gather_trajectory_groups(
            (
                art.TrajectoryGroup(rollout(model, i, is_validation=False) for _ in range(ROLLOUTS))
                for _ in range(1)
            ),
            pbar_desc="gather",
            max_exceptions=ROLLOUTS // 4,
        )
        await model.delete_checkpoints()
        await model.train(
            train_groups,
            config=art.TrainConfig(learning_rate=1e-2),
            _config={"logprob_calculation_chunk_size": 8},
        )
    await backend.close()


if __name__ == "__main__":
    asyncio.run(main())
