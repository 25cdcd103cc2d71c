"""art_core: train existing agents with GRPO through a token-exact capture gateway.

Example:
    >>> import art_core as art
    >>> model = art.TrainableModel(name="agent-001", project="demo", base_model="smollm2-135m")
    >>> # await model.register(art.LocalBackend()); async with art.capture(model) as run: ...
"""

from importlib import import_module
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
    from art_core.evals.evaluate import EvalReport, evaluate
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


# Parts built in their own modules, imported on first use (PEP 562), so that `import art_core`
# stays light: pydantic's configs, the distributed package (torch), evals (numpy), RULER.
# The TYPE_CHECKING block above names the same objects for type checkers. Each entry is
# public name -> (module, attribute in it).
_LAZY: dict[str, tuple[str, str]] = {
    **{n: ("art_core.training.config", n) for n in ("TrainConfig", "TrainResult", "SFTConfig")},
    "TeacherConfig": ("art_core.training.config", "TeacherConfig"),
    "TrainSFTConfig": ("art_core.training.config", "SFTConfig"),  # ART's name for the same
    "TrainingCancelled": ("art_core.training.cancel", "TrainingCancelled"),
    "TrainingWorld": ("art_core.training.distributed.world", "TrainingWorld"),
    "best_trajectories": ("art_core.sft", "best_trajectories"),
    "load_chat_jsonl": ("art_core.sft", "load_chat_jsonl"),
    "TeacherProxy": ("art_core.sft.teacher", "TeacherProxy"),
    "teacher_trajectories": ("art_core.sft.teacher", "teacher_trajectories"),
    "evaluate": ("art_core.evals", "evaluate"),
    "EvalReport": ("art_core.evals", "EvalReport"),
    **{n: ("art_core.rewards", n) for n in ("ruler", "ruler_score_group", "DEFAULT_RUBRIC")},
}


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module 'art_core' has no attribute {name!r}")
    module, attribute = _LAZY[name]
    return getattr(import_module(module), attribute)
