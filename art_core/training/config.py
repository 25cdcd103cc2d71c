"""What a training step is asked to do (``TrainConfig``) and what it reports (``TrainResult``).

Both are pydantic models so they validate their input, round-trip through JSON and can be
sent over HTTP by a remote backend unchanged.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from art_core.diagnoses.diagnosis import Diagnosis
from art_core.engines.base import MAX_PROMPT_LOGPROBS
from art_core.memory import STARTUP, MemoryBudget

# The linear projections of Llama/Qwen/Mistral-style decoders: every linear layer of the
# transformer blocks, the output head excluded (the same default as ART).
DEFAULT_LORA_TARGET_MODULES: tuple[str, ...] = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
)


# Hard ceilings (any process); a server's ``TrainLimits`` are lower by default.
MAX_LORA_RANK = 4096
MAX_EPOCHS = 10_000

# ``TrainConfig.off_policy_mask``'s default: IcePop's band (Ring-1T), see the field.
DEFAULT_OFF_POLICY_MASK = (0.5, 5.0)


def check_off_policy_mask(band: tuple[float, float]) -> tuple[float, float]:
    """``band`` as ``(low, high)`` when it is a valid ``off_policy_mask``: both finite and
    ``0 < low < 1 < high``, so a ratio of 1 (trainer and sampler agree) is always kept.

    Example:
        >>> check_off_policy_mask((0.5, 5))
        (0.5, 5.0)
        >>> check_off_policy_mask((2.0, 5.0))
        Traceback (most recent call last):
        ...
        ValueError: off_policy_mask must be (low, high) with 0 < low < 1 < high, both finite; got (2.0, 5.0)
    """
    values = [float(value) for value in band]
    if len(values) != 2 or not all(map(math.isfinite, values)) or not 0 < values[0] < 1 < values[1]:
        raise ValueError(
            "off_policy_mask must be (low, high) with 0 < low < 1 < high, both finite; "
            f"got {tuple(band)}"
        )
    return values[0], values[1]


class TrainingSettings(BaseModel):
    """What every kind of step on a model's adapter shares (GRPO ``TrainConfig`` and
    ``SFTConfig``): the optimizer, the LoRA adapter's shape, micro-batching and precision.

    The LoRA fields are fixed when the adapter is created (first step); a later step asking
    for a different rank, alpha or target modules is an error, not a silent re-init.

    Every field has a range (its ``Field`` bounds, shown in the JSON schema): wide enough
    for any real run, narrow enough that no value can make a step endless or allocate
    without bound. A server narrows them further (``TrainLimits``; an operator raises them
    with ``art-core serve --max-...``).

    Example:
        >>> TrainingSettings(lora_rank=16).lora_settings()["r"]
        16
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Optimizer (AdamW on the LoRA weights only; the learning rate is each config's own).
    weight_decay: float = Field(default=0.0, ge=0, le=10)
    adam_betas: tuple[float, float] = (0.9, 0.99)
    max_grad_norm: float | None = Field(
        default=1.0,
        gt=0,
        le=1e6,
        description="Clip the global gradient norm to this; None = no clipping.",
    )

    # LoRA adapter.
    lora_rank: int = Field(default=8, ge=1, le=MAX_LORA_RANK)
    lora_alpha: int = Field(default=16, ge=1, le=65_536)
    lora_dropout: float = Field(default=0.0, ge=0, lt=1)
    lora_target_modules: tuple[Annotated[str, Field(min_length=1, max_length=200)], ...] = Field(
        default=DEFAULT_LORA_TARGET_MODULES, max_length=256
    )

    # Batching.
    max_tokens_per_batch: int = Field(
        default=4096,
        ge=16,
        le=1_048_576,
        description="Token budget of one micro-batch (one forward/backward), at most: the "
        "memory budget may make micro-batches smaller. A sequence longer than the budget gets "
        "a micro-batch of its own.",
    )
    memory_budget: int | str | None = Field(
        default=None,
        description="The peak memory a step may reach (the process's resident memory; on "
        "CUDA the device's): micro-batches get as many tokens as fit it, at most "
        "max_tokens_per_batch, and a sequence that cannot fit alone is refused before any "
        "forward (SequenceTooLargeError). Bytes, a size ('6GiB', '6GB', '512MiB'), a share "
        "of the memory this process could use at start ('40%'), or 'off' (micro-batches by "
        "max_tokens_per_batch alone). None = $ART_CORE_MEMORY_BUDGET, else 50% of the cgroup "
        "memory limit or MemAvailable (whichever is lower) when the process started; on "
        "CUDA 50% of the device memory free at the first step.",
    )
    packing: bool = Field(
        default=True, description="Pack several sequences per row (attention kept inside each one)."
    )
    share_prefixes: bool = Field(
        default=True,
        description="With packing, run a prompt shared by several rollouts once per row.",
    )
    gradient_checkpointing: bool | None = Field(
        default=None,
        description="Recompute each layer's activations in backward instead of keeping them "
        "(2.5-3.5x less memory per token measured, ~40% more compute). None = on for a step "
        "whose longest sequence would not fit the memory budget without it.",
    )

    seed: int = Field(default=0, ge=0, le=2**62)  # + the step number, for torch.manual_seed
    precision: Literal["auto", "bf16", "fp32"] = Field(
        default="auto",
        description="'auto': bf16 autocast on CUDA with bf16 and on CPUs with native bf16 "
        "(AVX512-BF16/AMX, ~2x faster there), fp32 otherwise.",
    )

    @field_validator("memory_budget")
    @classmethod
    def _check_memory_budget(cls, value: int | str | None) -> int | str | None:
        if value is not None:
            # A share ("40%") is checked for its form here; it is taken of the machine that
            # trains, when the step runs.
            MemoryBudget.parse(value, source="memory_budget", machine=STARTUP.usable or 2**40)
        return value

    @model_validator(mode="after")
    def _check_ranges(self) -> TrainingSettings:
        if not self.lora_target_modules:
            raise ValueError("lora_target_modules must name at least one module")
        low, high = self.adam_betas
        if not (0 <= low < 1 and 0 <= high < 1):
            raise ValueError(f"adam_betas must lie in [0, 1), got {self.adam_betas}")
        return self

    def lora_settings(self) -> dict[str, object]:
        """The fields that define the adapter's shape, for comparing with a checkpoint."""
        return {
            "r": self.lora_rank,
            "lora_alpha": self.lora_alpha,
            "target_modules": sorted(self.lora_target_modules),
        }


class TeacherConfig(BaseModel):
    """The teacher of on-policy distillation: who scores the student's own sampled tokens.

    After sampling, the teacher reads each trained sequence (the student's token ids: both
    must share one tokenizer) and returns its logprob of every sampled token, plus its
    ``top_k`` most likely tokens there. The trainer adds ``weight`` times the per-token
    reverse KL(student || teacher) to the loss (``training.loss.reverse_kl``):

    - ``top_k = 0``: the sampled-token estimate ``log p_s(x) - log p_t(x)``, trained through
      its score-function gradient (any endpoint that returns prompt logprobs can give it);
    - ``top_k > 0``: the reverse KL over the teacher's top-k tokens plus one bucket for every
      other token, differentiated directly (exact when k covers the vocabulary); lower
      variance, and it needs the teacher's top-k (a local teacher, vLLM, this gateway).

    With ``rl=False`` the reward-driven policy loss is left out (distillation alone) and
    every rollout is trained, whatever its reward; with ``rl=True`` the two add up, and
    groups whose rewards are all equal are still trained on (distillation term only).

    The teacher is a local model (``model`` a Hugging Face folder or an embedded name, with an
    optional PEFT ``adapter`` folder, run in the trainer's process) or, with ``base_url``, any
    OpenAI-compatible server returning vLLM-style ``prompt_logprobs`` (vLLM, this gateway);
    ``model`` is then the served name and the API key is read from ``api_key_env``.

    Example:
        >>> TeacherConfig(model="tiny-random", adapter=".art/p/models/teacher/checkpoints/0008").rl
        True
        >>> TeacherConfig(model="Qwen/Qwen3-8B", base_url="http://127.0.0.1:8000/v1", top_k=5).top_k
        5
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(min_length=1, max_length=4096)
    base_url: str | None = Field(default=None, min_length=1, max_length=4096)
    adapter: str | None = Field(default=None, min_length=1, max_length=4096)
    api_key_env: str | None = Field(default=None, min_length=1, max_length=256)
    top_k: int = Field(
        default=MAX_PROMPT_LOGPROBS,
        ge=0,
        le=MAX_PROMPT_LOGPROBS,
        description="Teacher tokens per position for the top-k KL; 0 = the sampled-token "
        "estimate (needs only the sampled tokens' logprobs, but has far more variance).",
    )
    weight: float = Field(
        default=1.0, gt=0, le=1e3, description="Coefficient of the reverse KL in the loss."
    )
    rl: bool = Field(
        default=True, description="Keep the reward-driven policy loss (False: distill alone)."
    )
    timeout_s: float = Field(default=600.0, gt=0, le=86_400)

    @model_validator(mode="after")
    def _check_source(self) -> TeacherConfig:
        if self.base_url is not None and self.adapter is not None:
            raise ValueError(
                "adapter applies to a local teacher; an endpoint teacher (base_url) serves "
                "its adapter itself: name it in model"
            )
        if self.base_url is not None and not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, got {self.base_url!r}")
        return self


class TrainConfig(TrainingSettings):
    """Hyperparameters of one ``train`` call (one GRPO step, unless asked for more).

    The optimizer, LoRA, batching and precision fields are ``TrainingSettings``'; the LoRA
    shape must match the adapter's (see there).

    Example:
        >>> config = TrainConfig(learning_rate=1e-5, loss="cispo", epsilon_high=0.28)
        >>> config.upper_epsilon
        0.28
        >>> TrainConfig.model_validate_json(config.model_dump_json()) == config
        True
    """

    learning_rate: float = Field(default=5e-6, gt=0, le=10, description="AdamW learning rate.")

    # Objective.
    loss: Literal["ppo", "cispo"] = Field(
        default="ppo",
        description="'ppo': clipped ratio objective. 'cispo': clipped, detached importance "
        "weight times the token logprob (every token keeps a gradient).",
    )
    epsilon: float = Field(
        default=0.2, gt=0, le=100, description="Lower clip range: ratio >= 1 - epsilon."
    )
    epsilon_high: float | None = Field(
        default=None,
        gt=0,
        le=100,
        description="Upper clip range: ratio <= 1 + epsilon_high (None = epsilon).",
    )
    truncated_importance_sampling: float | None = Field(
        default=None,
        gt=0,
        le=1e6,
        description="Cap C of truncated importance sampling: each token's loss is weighted by "
        "min(p_trainer / p_sampler, C) to correct the sampler/trainer mismatch. None = off.",
    )
    off_policy_mask: tuple[float, float] | None = Field(
        default=DEFAULT_OFF_POLICY_MASK,
        description="Masked importance sampling (IcePop): a token whose trainer/sampler "
        "probability ratio exp(logp_trainer - logp_sampler), the trainer's logprob taken before "
        "the update, lies outside [low, high] gets no policy gradient (at the sequence level: a "
        "whole sequence, by its geometric-mean ratio). Kept tokens train exactly as without it "
        "(then TIS, if on, weights them by min(ratio, C)); masked ones stay in the loss "
        "normalisation. Reported as train/off_policy/masked_share. None = off.",
    )
    # On by default, with IcePop's band. Sources read: the IcePop objective and the band it
    # trained Ring-1T with, alpha=0.5, beta=5 ("Every Step Evolves", IcePop section and
    # training recipe; its blog saw 1-2 per mille of tokens masked on a MoE model with a
    # separate inference engine); slime's ``icepop_function`` (band [tis_clip_low, tis_clip]);
    # verl's rollout correction (``rollout_rs``: token, sequence or geometric rejection, off
    # by default, lower bound 1/upper when unset); TRL 1.16, which masks by default when vLLM
    # samples (``vllm_importance_sampling_mode="sequence_mask"``, C_max 3); Liu, Li et al.,
    # "When Speed Kills Stability" (masking, MIS, over truncating: the worst mismatches sit on
    # low-probability tokens, which give the largest gradients); Yao et al., "Your Efficient
    # RL Framework Secretly Brings You Off-Policy RL Training" (TIS, C=2: the setting above).
    # Here the sampler is our own engine on the same weights (fp32: the ratio is 1 to float
    # precision; bf16 or vLLM: rounding), so the band masks nothing while trainer and sampler
    # agree, and the loss is then unchanged. It drops the tokens whose recorded probability is
    # off by 2x-5x: a sampler that recorded other logprobs (another temperature, adapter or
    # model), or in a pipeline a token the updates since its sampling made 2x less or 5x more
    # likely. Cost: it needs the trainer's logprobs before the update, free with one optimizer
    # update per epoch; with several, one no-grad forward of the later updates' micro-batches
    # (the pass TIS needs too). A high masked share means the sampler's logprobs are not the
    # trainer's: fix that rather than widen the band.
    beta: float = Field(
        default=0.0, ge=0, le=1e3, description="Weight of the k3 KL penalty to the base model."
    )
    importance_sampling_level: Literal["token", "sequence"] = Field(
        default="token",
        description="'token': one ratio per token (GRPO). 'sequence': GSPO's ratio, the "
        "geometric mean of a sequence's token ratios, clipped per sequence (and truncated "
        "importance sampling at the same level). See training.loss.",
    )
    loss_normalization: Literal["grpo", "dapo", "dr_grpo"] = Field(
        default="grpo",
        description="How token losses are summed into a step's loss (training.advantages): "
        "'grpo': every rollout weighs the same (mean over rollouts of each rollout's token "
        "mean); 'dapo': every token weighs the same (sum / trained tokens of the step); "
        "'dr_grpo': a constant normaliser (sum / (rollouts * dr_grpo_length)).",
    )
    dr_grpo_length: int | None = Field(
        default=None,
        ge=1,
        le=16_777_216,
        description="Dr. GRPO's constant L, in tokens per rollout (TRL's max_completion_length). "
        "None = the most trained tokens of any rollout of the step.",
    )
    scale_rewards: Literal["group", "batch", "none"] = Field(
        default="group",
        description="Divide advantages by the reward std of the group (GRPO), of the whole "
        "step ('batch', as TRL), or not at all ('none', Dr. GRPO). True/False mean "
        "'group'/'none'.",
    )
    teacher: TeacherConfig | None = Field(
        default=None,
        description="On-policy distillation: a teacher scores the student's sampled tokens and "
        "the reverse KL to it joins the loss (see TeacherConfig).",
    )

    @property
    def trains_equal_groups(self) -> bool:
        """Whether groups whose rewards are all equal are trained: they carry no advantage,
        but a teacher's KL still teaches from them.

        Example:
            >>> TrainConfig().trains_equal_groups
            False
        """
        return self.teacher is not None

    @field_validator("off_policy_mask")
    @classmethod
    def _check_off_policy_mask(
        cls, value: tuple[float, float] | None
    ) -> tuple[float, float] | None:
        return None if value is None else check_off_policy_mask(value)

    @field_validator("scale_rewards", mode="before")
    @classmethod
    def _scale_rewards_bool(cls, value: object) -> object:
        # ART (and earlier versions of this config) pass a bool.
        if isinstance(value, bool):
            return "group" if value else "none"
        return value

    # Schedule: by default one optimizer step per ``train`` call, whatever the batch size
    # (gradients of all micro-batches are accumulated).
    num_epochs: int = Field(
        default=1, ge=1, le=MAX_EPOCHS, description="Passes over the trajectories of the call."
    )
    optimizer_steps_per_epoch: int = Field(
        default=1,
        ge=1,
        le=100_000,
        description="Split each pass into this many optimizer steps (by rollout).",
    )

    @property
    def upper_epsilon(self) -> float:
        """The upper clip range: ``epsilon_high`` when set, else ``epsilon``."""
        return self.epsilon if self.epsilon_high is None else self.epsilon_high


# ART's ``batch_size="auto"`` for SFT: two trajectories per optimizer step.
DEFAULT_SFT_BATCH_SIZE = 2
# The most learning rates a per-step list may give (a bound on what a caller can send).
MAX_LEARNING_RATES = 1_000_000


class SFTConfig(TrainingSettings):
    """Hyperparameters of one ``train_sft`` call: epochs of cross-entropy on assistant tokens.

    Names as in ART's ``TrainSFTConfig`` (``learning_rate`` as one value or one per optimizer
    step, ``batch_size``, ``assistant_turns``) and its SFT helpers (``epochs``,
    ``schedule_type``, ``warmup_ratio``). One call makes ``epochs * ceil(records /
    batch_size)`` optimizer steps and writes one checkpoint, like a GRPO ``train`` call; the
    optimizer, LoRA and batching fields are ``TrainingSettings``' and the LoRA shape must
    match the adapter's, so SFT and GRPO steps take turns on one adapter.

    Example:
        >>> config = SFTConfig(learning_rate=2e-4, epochs=3, batch_size=8, warmup_ratio=0.1)
        >>> config.resolved_batch_size, config.schedule_type
        (8, 'constant')
        >>> SFTConfig.model_validate_json(config.model_dump_json()) == config
        True
    """

    learning_rate: float | list[float] = Field(
        default=5e-5,
        description="AdamW learning rate: the peak of the schedule, or a list with one rate "
        "per optimizer step (then its length must equal the number of steps).",
    )
    batch_size: int | Literal["auto"] = Field(
        default="auto",
        description="Records (trajectories, chat records) per optimizer step; 'auto' = 2.",
    )
    assistant_turns: Literal["all", "last"] = Field(
        default="all",
        description="Train on every assistant turn of a record, or only on its last one.",
    )
    epochs: int = Field(default=1, ge=1, le=MAX_EPOCHS, description="Passes over the records.")
    schedule_type: Literal["constant", "linear", "cosine"] = Field(
        default="constant",
        description="Learning-rate decay from the peak to 0 over the call's optimizer steps.",
    )
    warmup_ratio: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="Share of the optimizer steps spent ramping the rate up linearly first.",
    )
    shuffle: bool = Field(
        default=True, description="Shuffle the records before each epoch (seeded by seed)."
    )

    @model_validator(mode="after")
    def _check_schedule(self) -> SFTConfig:
        rates = self.learning_rate if isinstance(self.learning_rate, list) else [self.learning_rate]
        if not rates or len(rates) > MAX_LEARNING_RATES:
            raise ValueError(
                f"learning_rate lists must hold 1 to {MAX_LEARNING_RATES} rates, got {len(rates)}"
            )
        bad = next((r for r in rates if not (math.isfinite(r) and r > 0)), None)
        if bad is not None:
            raise ValueError(f"learning rates must be finite and > 0, got {bad!r}")
        if isinstance(self.learning_rate, list) and (
            self.schedule_type != "constant" or self.warmup_ratio > 0
        ):
            raise ValueError(
                "learning_rate is a list of per-step rates already: schedule_type must be "
                "'constant' and warmup_ratio 0"
            )
        if isinstance(self.batch_size, int) and not 1 <= self.batch_size <= 1_000_000:
            raise ValueError(f"batch_size must be 'auto' or 1 to 1000000, got {self.batch_size}")
        return self

    @property
    def resolved_batch_size(self) -> int:
        """``batch_size`` with ``'auto'`` resolved (ART's default of 2)."""
        return DEFAULT_SFT_BATCH_SIZE if self.batch_size == "auto" else self.batch_size


class TrainResult(BaseModel):
    """What one ``train`` call produced: the new step, its metrics and its checkpoint folder.

    ``checkpoint_path`` is a standard PEFT adapter folder (loadable with
    ``PeftModel.from_pretrained``), plus the optimizer state and trainer state. When the
    groups held nothing to train on, ``nothing_trained`` says why, ``step`` is unchanged and
    ``checkpoint_path`` is the current checkpoint (None for the base model). ``diagnoses``
    are the rules of ``art_core.diagnoses`` that fired on the step's records, each naming the
    setting that would change what it found.

    Example:
        >>> result = TrainResult(step=1, metrics={"train/loss": 0.1}, checkpoint_path="/m/0001")
        >>> TrainResult.model_validate_json(result.model_dump_json()).step
        1
    """

    model_config = ConfigDict(extra="forbid")

    step: int = Field(ge=0)
    metrics: dict[str, float] = Field(default_factory=dict)
    checkpoint_path: str | None
    nothing_trained: str | None = None
    # Why the step's groups taught little or nothing, read from their records
    # (``art_core.diagnoses``): filled in by the backend after the step.
    diagnoses: list[Diagnosis] = Field(default_factory=list)
