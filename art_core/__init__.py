"""art_core: train existing agents with GRPO through a token-exact capture gateway."""

from art_core.trajectories import LLMCall, RolloutException, Trajectory, TrajectoryGroup

__all__ = ["LLMCall", "RolloutException", "Trajectory", "TrajectoryGroup"]
