"""What ART's ``InternalModelConfig`` means here: defaults for every ``TrainConfig``.

A knob with the same meaning in this project's trainer is applied (``peft_args`` -> the LoRA
shape, ``trainer_args`` -> the optimizer); an explicit ``TrainConfig`` field or keyword setting
of a ``train`` call still wins. The rest (vLLM engine arguments, Unsloth loading, GPU ids)
tune ART's own GPU pipeline, which this project does not run: they are returned as ignored,
for a warning that names them.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from art_core.chat_formats import CHAT_FORMAT_KEYS

# (section, ART key) -> TrainConfig field
_FIELDS = {
    ("peft_args", "r"): "lora_rank",
    ("peft_args", "lora_alpha"): "lora_alpha",
    ("peft_args", "lora_dropout"): "lora_dropout",
    ("peft_args", "target_modules"): "lora_target_modules",
    ("trainer_args", "learning_rate"): "learning_rate",
    ("trainer_args", "weight_decay"): "weight_decay",
    ("trainer_args", "max_grad_norm"): "max_grad_norm",
    ("trainer_args", "gradient_checkpointing"): "gradient_checkpointing",
    ("trainer_args", "seed"): "seed",
}
_BETAS = ("adam_beta1", "adam_beta2")


def train_defaults(internal_config: Mapping[str, Any] | None) -> tuple[dict[str, Any], list[str]]:
    """``TrainConfig`` fields set by an ART ``InternalModelConfig``, and the keys ignored.

    Raises ``TypeError`` when a section is not a mapping (``peft_args=16``).

    Example:
        >>> train_defaults({"peft_args": {"r": 16}, "engine_args": {"enforce_eager": True}})
        ({'lora_rank': 16}, ['engine_args.enforce_eager'])
    """
    # Pydantic models: kept off `import art_core` (~15 ms).
    from art_core.training.config import TrainConfig

    fields: dict[str, Any] = {}
    ignored: list[str] = []
    for section, values in (internal_config or {}).items():
        if section in CHAT_FORMAT_KEYS:
            continue  # how the model's answers are read when served, not a training knob
        if not isinstance(values, Mapping):
            if isinstance(values, list | tuple) and section.endswith("gpu_ids"):
                ignored.append(section)
                continue
            raise TypeError(
                f"_internal_config[{section!r}] must be a dict of settings, "
                f"got {type(values).__name__}"
            )
        for key, value in values.items():
            field = _FIELDS.get((section, key))
            if field == "lora_target_modules":
                fields[field] = tuple(value)
            elif field is not None:
                fields[field] = value
            elif section == "trainer_args" and key in _BETAS:
                default = TrainConfig.model_fields["adam_betas"].default
                betas = list(fields.get("adam_betas", default))
                betas[_BETAS.index(key)] = value
                fields["adam_betas"] = tuple(betas)
            else:
                ignored.append(f"{section}.{key}")
    return fields, ignored


def internal_overrides(
    internal_config: Mapping[str, Any], config: Any, overrides: Mapping[str, Any]
) -> dict[str, Any]:
    """The ``TrainConfig`` settings a model's ``_internal_config`` adds to one train call:
    its defaults for the fields that ``config`` (a ``TrainConfig``) and ``overrides`` leave
    unset. Warns, naming the keys that have no effect here.

    Example:
        >>> from art_core.training.config import TrainConfig
        >>> internal_overrides({"peft_args": {"r": 16}}, TrainConfig(), {})
        {'lora_rank': 16}
    """
    fields, ignored = train_defaults(internal_config)
    if ignored:
        warnings.warn(
            f"_internal_config: {', '.join(ignored)} tune ART's vLLM / Unsloth GPU pipeline "
            "and have no effect here",
            stacklevel=4,
        )
    explicit = set(config.model_fields_set) | set(overrides)
    return {field: value for field, value in fields.items() if field not in explicit}
