"""``art.dev``: ART's unstable configuration types, accepted so ART code runs unchanged.

``TrainableModel(_internal_config=art.dev.InternalModelConfig(...))`` (or assigning
``model._internal_config``) applies the knobs that mean something here (LoRA shape and
optimizer settings, as defaults of every ``TrainConfig``); those that tune ART's own
vLLM / Unsloth GPU pipeline are accepted and named in a warning. See ``art_core.dev.apply``.

Example:
    >>> import art_core as art
    >>> config = art.dev.InternalModelConfig(peft_args=art.dev.PeftArgs(r=16, lora_alpha=32))
    >>> art.dev.train_defaults(config)[0]
    {'lora_rank': 16, 'lora_alpha': 32}
"""

from art_core.dev.apply import train_defaults
from art_core.dev.config import (
    EngineArgs,
    InitArgs,
    InternalModelConfig,
    OpenAIServerConfig,
    PeftArgs,
    ServerArgs,
    TrainConfig,
    TrainerArgs,
    TrainSFTConfig,
)

__all__ = [
    "EngineArgs",
    "InitArgs",
    "InternalModelConfig",
    "OpenAIServerConfig",
    "PeftArgs",
    "ServerArgs",
    "TrainConfig",
    "TrainSFTConfig",
    "TrainerArgs",
    "train_defaults",
]
