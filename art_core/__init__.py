"""art_core: train existing agents with GRPO through a token-exact capture gateway.

Example:
    >>> import art_core as art
    >>> model = art.TrainableModel(name="agent-001", project="demo", base_model="smollm2-135m")
    >>> # await model.register(art.LocalBackend()); async with art.capture(model) as run: ...
"""

from typing import TYPE_CHECKING

from art_core import dev
from art_core.backends.base import Backend
from art_core.backends.local import LocalBackend
from art_core.backends.remote import RemoteBackend
from art_core.batches import trajectory_group_batches
from art_core.capture import Run, capture, current_run
from art_core.gateway.rollout_sampling import RolloutSampling
from art_core.gather import (
    TooManyExceptions,
    gather_trajectories,
    gather_trajectory_groups,
)
from art_core.messages import (
    Message,
    MessageOrChoice,
    Messages,
    MessagesAndChoices,
    Tools,
)
from art_core.model import Model, TrainableModel
from art_core.pipeline import PipelineTrainer, make_group_rollout_fn
from art_core.retry import retry
from art_core.sampling import SamplingReport, ScenarioHistory, ScenarioSampler
from art_core.trajectories import (
    History,
    LLMCall,
    RolloutException,
    Trajectory,
    TrajectoryGroup,
)

if TYPE_CHECKING:  # imported lazily below; these lines give type checkers the real types
    from art_core.evals import EvalReport, evaluate
    from art_core.rewards import DEFAULT_RUBRIC, ruler, ruler_score_group
    from art_core.sft import best_trajectories, load_chat_jsonl
    from art_core.sft.teacher import TeacherProxy, teacher_trajectories
    from art_core.training.cancel import TrainingCancelled
    from art_core.training.config import SFTConfig, TeacherConfig, TrainConfig, TrainResult
    from art_core.training.distributed.world import TrainingWorld

    TrainSFTConfig = SFTConfig

__all__ = [
    "DEFAULT_RUBRIC",
    "Backend",
    "EvalReport",
    "History",
    "LLMCall",
    "LocalBackend",
    "Message",
    "MessageOrChoice",
    "Messages",
    "MessagesAndChoices",
    "Model",
    "PipelineTrainer",
    "RemoteBackend",
    "RolloutException",
    "RolloutSampling",
    "Run",
    "SFTConfig",
    "SamplingReport",
    "ScenarioHistory",
    "ScenarioSampler",
    "TeacherConfig",
    "TeacherProxy",
    "TooManyExceptions",
    "Tools",
    "TrainConfig",
    "TrainResult",
    "TrainSFTConfig",
    "TrainableModel",
    "TrainingCancelled",
    "TrainingWorld",
    "Trajectory",
    "TrajectoryGroup",
    "best_trajectories",
    "capture",
    "current_run",
    "dev",
    "evaluate",
    "gather_trajectories",
    "gather_trajectory_groups",
    "load_chat_jsonl",
    "make_group_rollout_fn",
    "retry",
    "ruler",
    "ruler_score_group",
    "teacher_trajectories",
    "trajectory_group_batches",
]


def __getattr__(name: str) -> object:
    # Parts built in their own modules, imported on first use (training pulls in peft).
    if name in ("TrainConfig", "TrainResult", "SFTConfig", "TeacherConfig"):
        from art_core.training import config

        return getattr(config, name)
    if name == "TrainingCancelled":
        from art_core.training.cancel import TrainingCancelled

        return TrainingCancelled
    if name == "TrainingWorld":
        from art_core.training.distributed import world

        return world.TrainingWorld
    if name == "TrainSFTConfig":  # ART's name for the same config
        from art_core.training.config import SFTConfig

        return SFTConfig
    if name in ("best_trajectories", "load_chat_jsonl"):
        from art_core import sft

        return getattr(sft, name)
    if name in ("TeacherProxy", "teacher_trajectories"):
        from art_core.sft import teacher

        return getattr(teacher, name)
    if name in ("evaluate", "EvalReport"):
        from art_core import evals

        return getattr(evals, name)
    if name in ("ruler", "ruler_score_group", "DEFAULT_RUBRIC"):
        from art_core import rewards

        return getattr(rewards, name)
    raise AttributeError(f"module 'art_core' has no attribute {name!r}")
