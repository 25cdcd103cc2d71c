"""ART's ``art.dev`` configuration types, by ART's names and keys.

They are ``TypedDict``s as in ART: plain dicts at runtime, checked only by a type checker.
The keys listed are those ART's examples and docs use; ART's full vLLM / Unsloth / TRL
argument lists are not repeated here (a dict with other keys is accepted all the same).
``art_core.dev.apply`` says which keys act on this project's trainer.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import TypedDict


class InitArgs(TypedDict, total=False):
    """ART: arguments for loading the model in Unsloth (``FastLanguageModel``)."""

    model_name: str
    max_seq_length: int
    dtype: str | None
    load_in_4bit: bool
    load_in_8bit: bool
    full_finetuning: bool
    fast_inference: bool
    gpu_memory_utilization: float
    max_lora_rank: int
    enable_prefix_caching: bool
    use_async: bool


class EngineArgs(TypedDict, total=False):
    """ART: vLLM engine arguments."""

    max_model_len: int | None
    max_num_seqs: int | None
    max_num_batched_tokens: int | None
    gpu_memory_utilization: float
    enforce_eager: bool | None
    enable_prefix_caching: bool | None
    enable_sleep_mode: bool
    num_scheduler_steps: int
    tensor_parallel_size: int
    max_loras: int
    max_lora_rank: int
    seed: int
    dtype: str
    generation_config: str | None
    disable_log_requests: bool


class PeftArgs(TypedDict, total=False):
    """ART: the LoRA adapter's shape (peft / Unsloth ``get_peft_model``)."""

    r: int
    lora_alpha: int
    lora_dropout: float
    target_modules: list[str]
    bias: str
    use_rslora: bool
    use_gradient_checkpointing: bool | str
    random_state: int


class TrainerArgs(TypedDict, total=False):
    """ART: trainer arguments (TRL ``GRPOConfig`` names)."""

    learning_rate: float
    weight_decay: float
    adam_beta1: float
    adam_beta2: float
    max_grad_norm: float
    gradient_checkpointing: bool
    seed: int
    lr_scheduler_type: str
    optim: str
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    num_generations: int
    logging_steps: float
    output_dir: str | None
    report_to: str | list[str] | None


class InternalModelConfig(TypedDict, total=False):
    """ART: ``TrainableModel(_internal_config=...)``, the model's engine and trainer knobs."""

    init_args: InitArgs
    engine_args: EngineArgs
    peft_args: PeftArgs
    trainer_args: TrainerArgs
    trainer_gpu_ids: list[int]
    inference_gpu_ids: list[int]
    # Not ART's: how the gateway reads this model's answers, by vLLM's parser names
    # (detected from the chat template when not given; see art_core.chat_formats).
    tool_call_parser: str
    reasoning_parser: str


class TrainConfig(TypedDict, total=False):
    """ART: ``model.train(..., _config=...)``, per-step training knobs."""

    allow_training_without_logprobs: bool
    epsilon: float
    epsilon_high: float | None
    scale_rewards: bool | str
    importance_sampling_level: str
    logprob_calculation_chunk_size: int
    plot_tensors: bool
    precalculate_logprobs: bool


class TrainSFTConfig(TypedDict, total=False):
    """ART: per-step SFT knobs (``_config`` of an SFT step)."""

    batch_size: int | str
    learning_rate: float


class ServerArgs(TypedDict, total=False):
    """ART: arguments of the vLLM OpenAI-compatible server it starts."""

    host: str | None
    port: int
    api_key: str | None
    tool_call_parser: str | None
    enable_auto_tool_choice: bool
    return_tokens_as_token_ids: bool


class OpenAIServerConfig(TypedDict, total=False):
    """ART: ``backend._experimental_..._openai_server(config=...)``."""

    log_file: str
    server_args: ServerArgs
    engine_args: EngineArgs
    extra: dict[str, Any]
