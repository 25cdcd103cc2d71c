"""art_reasoning_gym: train on reasoning-gym generators with a tool, scored by their own check.

A reasoning-gym dataset's rows become ``art_mcp`` scenarios (``scenarios_from_dataset``), the
model gets the ``calculate`` tool of the small MCP server this package ships
(``CALCULATOR_SERVER``, for the arithmetic generators), and each run is scored by the
dataset's own ``score_answer`` (``score_answer_reward``). ``art_mcp.rollout`` and
``art_mcp.train`` run it unchanged, through the gateway, token-exactly.

Example:
    >>> import reasoning_gym, art_mcp, art_reasoning_gym as arg
    >>> dataset = reasoning_gym.create_dataset("basic_arithmetic", size=32, seed=0)
    >>> report = await art_mcp.train(model, arg.CALCULATOR_SERVER,
    ...                              arg.scenarios_from_dataset(dataset),
    ...                              reward_fn=arg.score_answer_reward(dataset))  # needs a registered model  # doctest: +SKIP
"""

from art_reasoning_gym.calculator import CALCULATOR_SERVER, compute
from art_reasoning_gym.scenarios import (
    DATASET_KEY,
    INDEX_KEY,
    scenarios_from_dataset,
    score_answer_reward,
)

__all__ = [
    "CALCULATOR_SERVER",
    "DATASET_KEY",
    "INDEX_KEY",
    "compute",
    "scenarios_from_dataset",
    "score_answer_reward",
]
