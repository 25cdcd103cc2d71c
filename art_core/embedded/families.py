"""``tiny-<family>``: seeded tiny models of the families users train, built offline for tests.

Each one carries its family's real architecture class (``Qwen2ForCausalLM``,
``GptOssForCausalLM``, ...), its special and added tokens with the real tokenizer's ``special``
flags and relative order, eos/pad/bos as the real checkpoint sets them (tokenizer,
``config.json`` and ``generation_config.json``), and a chat template that renders the family's
own prompt format (``templates/<family>.jinja``). Weights are random (2 layers, hidden size
64) and the vocabulary is a small byte-level BPE (~700 tokens) trained on ``corpus.txt``, so a
model builds in well under a second, yet every family-specific path (template, stop tokens,
LoRA targets, sliding-window or MoE layers) runs as on the real model.

Example:
    >>> build_tiny_family(Path("tiny-qwen3"), "qwen3", seed=0)
    >>> sorted(FAMILIES)  # doctest: +NORMALIZE_WHITESPACE
    ['gemma3', 'gpt-oss', 'llama3', 'mistral', 'qwen2.5', 'qwen3', 'qwen3-coder']
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

BPE_VOCAB_SIZE = 1024
CONTEXT_LENGTH = 32768
# The shape every family shares: big enough for every architecture's constraints (heads
# divide the hidden size, kv heads divide heads), small enough to build and train in seconds.
HIDDEN = 64
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS


@dataclass(frozen=True)
class Family:
    """What makes a family's tiny model look like the real one to code that loads it.

    ``leading``: control tokens that come first in the real vocabulary (ids 0, 1, ...);
    ``trailing``: ``(token, special)`` pairs the real tokenizer adds after its BPE vocabulary,
    in its order. ``eos``/``pad``/``bos``/``unk``: the real tokenizer's settings;
    ``stop``: ``generation_config.json``'s eos ids; ``add_bos``: whether plain encoding puts
    ``bos`` first (Llama 3, Mistral and Gemma do, Qwen and gpt-oss do not).
    """

    architecture: str
    eos: str
    stop: tuple[str, ...]
    pad: str | None = None
    bos: str | None = None
    unk: str | None = None
    add_bos: bool = False
    leading: tuple[str, ...] = ()
    trailing: tuple[tuple[str, bool], ...] = ()
    # config.json's eos_token_id: the tokenizer's eos unless the real config lists several.
    config_eos: tuple[str, ...] | None = None
    config: dict[str, Any] = field(default_factory=dict)


# Qwen2.5's added tokens (ids 151643..151664 in the real vocabulary). `<tool_call>` and the
# FIM/repo tokens are special=False there: they decode with skip_special_tokens=True.
_QWEN25_ADDED = (
    *((token, True) for token in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")),
    *(
        (f"<|{name}|>", True)
        for name in (
            "object_ref_start",
            "object_ref_end",
            "box_start",
            "box_end",
            "quad_start",
            "quad_end",
            "vision_start",
            "vision_end",
            "vision_pad",
            "image_pad",
            "video_pad",
        )
    ),
    ("<tool_call>", False),
    ("</tool_call>", False),
    *(
        (f"<|{name}|>", False)
        for name in ("fim_prefix", "fim_middle", "fim_suffix", "fim_pad", "repo_name", "file_sep")
    ),
)
# Qwen3 appends four plain added tokens (151665..151668).
_QWEN3_ADDED = (
    *_QWEN25_ADDED,
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)


def _qwen(architecture: str, trailing: tuple[tuple[str, bool], ...]) -> Family:
    # Qwen's instruct checkpoints: eos <|im_end|>, pad <|endoftext|>, both stop generation.
    return Family(
        architecture,
        eos="<|im_end|>",
        pad="<|endoftext|>",
        stop=("<|im_end|>", "<|endoftext|>"),
        trailing=trailing,
    )


# Llama 3's first reserved block (128000..128010), reserved names kept so the ids line up.
_LLAMA3_ADDED = tuple(
    (token, True)
    for token in (
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|reserved_special_token_0|>",
        "<|reserved_special_token_1|>",
        "<|finetune_right_pad_id|>",
        "<|reserved_special_token_2|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eom_id|>",
        "<|eot_id|>",
        "<|python_tag|>",
    )
)
# o200k_harmony's specials (199998..200012), reserved ones kept so the ids line up.
_HARMONY_ADDED = tuple(
    (token, True)
    for token in (
        "<|startoftext|>",
        "<|endoftext|>",
        "<|reserved_200000|>",
        "<|reserved_200001|>",
        "<|return|>",
        "<|constrain|>",
        "<|reserved_200004|>",
        "<|channel|>",
        "<|start|>",
        "<|end|>",
        "<|message|>",
        "<|reserved_200009|>",
        "<|reserved_200010|>",
        "<|reserved_200011|>",
        "<|call|>",
    )
)

FAMILIES: dict[str, Family] = {
    "qwen2.5": _qwen("Qwen2ForCausalLM", _QWEN25_ADDED),
    "qwen3": _qwen("Qwen3ForCausalLM", _QWEN3_ADDED),
    "qwen3-coder": _qwen("Qwen3ForCausalLM", _QWEN3_ADDED),
    "llama3": Family(
        "LlamaForCausalLM",
        eos="<|eot_id|>",
        bos="<|begin_of_text|>",
        add_bos=True,
        stop=("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"),
        config_eos=("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"),
        trailing=_LLAMA3_ADDED,
    ),
    "mistral": Family(
        "MistralForCausalLM",
        eos="</s>",
        bos="<s>",
        unk="<unk>",
        add_bos=True,
        stop=("</s>",),
        leading=(
            "<unk>",
            "<s>",
            "</s>",
            "[INST]",
            "[/INST]",
            "[TOOL_CALLS]",
            "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]",
            "[TOOL_RESULTS]",
            "[/TOOL_RESULTS]",
        ),
        config={"sliding_window": None, "tie_word_embeddings": False},
    ),
    "gpt-oss": Family(
        "GptOssForCausalLM",
        eos="<|return|>",
        pad="<|endoftext|>",
        bos="<|startoftext|>",
        stop=("<|return|>", "<|endoftext|>", "<|call|>"),
        trailing=_HARMONY_ADDED,
        # A few small experts: the MoE routing and the alternating sliding (window 128, as the
        # real model's) and full attention layers run, in fp32 on a CPU.
        config={
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "intermediate_size": HIDDEN,
            "head_dim": HEAD_DIM,
            "sliding_window": 128,
            "max_position_embeddings": 131072,
            "tie_word_embeddings": False,
        },
    ),
    "gemma3": Family(
        "Gemma3ForCausalLM",
        eos="<eos>",
        pad="<pad>",
        bos="<bos>",
        unk="<unk>",
        add_bos=True,
        stop=("<eos>", "<end_of_turn>"),
        config_eos=("<eos>", "<end_of_turn>"),
        leading=("<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"),
        # One sliding (window 512, as Gemma 3 1B's) and one global layer: both kinds run.
        config={
            "head_dim": HEAD_DIM,
            "query_pre_attn_scalar": HEAD_DIM,
            "sliding_window": 512,
            "layer_types": ["sliding_attention", "full_attention"],
        },
    ),
}


# Raise when a change here changes what build_tiny_family writes (tokens, config, shapes).
RECIPE_VERSION = 1


@cache
def family_template(family: str) -> str:
    """The chat template of ``family`` (``templates/<family>.jinja``)."""
    folder = Path(__file__).parent / "templates"
    return (folder / f"{family}.jinja").read_text(encoding="utf-8")


def family_fingerprint(family: str) -> str:
    """What a built ``tiny-<family>`` folder depends on: the recipe version and the template.

    A cached folder with another fingerprint is rebuilt, so an edited template never leaves
    tests on a stale copy.

    Example:
        >>> family_fingerprint("qwen3")  # the recipe's version, a hash of the template
        'qwen3 recipe ... template ...'
    """
    digest = hashlib.sha256(family_template(family).encode()).hexdigest()[:12]
    return f"{family} recipe {RECIPE_VERSION} template {digest}"


def _tokenizer(spec: Family) -> Any:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers import trainers as bpe_trainers
    from transformers import PreTrainedTokenizerFast

    corpus = (Path(__file__).parent / "corpus.txt").read_text(encoding="utf-8")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = bpe_trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE,
        special_tokens=list(spec.leading),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus.splitlines(), trainer=trainer)
    # One at a time, so special and plain added tokens keep the real interleaved order.
    for token, special in spec.trailing:
        added = AddedToken(token, special=special, normalized=False)
        if special:
            bpe.add_special_tokens([added])
        else:
            bpe.add_tokens([added])
    if spec.add_bos:
        assert spec.bos is not None
        bos_id = bpe.token_to_id(spec.bos)
        bpe.post_processor = processors.TemplateProcessing(
            single=f"{spec.bos} $A",
            pair=f"{spec.bos} $A {spec.bos}:1 $B:1",
            special_tokens=[(spec.bos, bos_id)],
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=spec.eos,
        pad_token=spec.pad,
        bos_token=spec.bos,
        unk_token=spec.unk,
    )


def _config(spec: Family, ids: Callable[[str | None], int | None], vocab_size: int) -> Any:
    import transformers

    config_eos = [ids(token) for token in spec.config_eos] if spec.config_eos else ids(spec.eos)
    settings: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": HIDDEN,
        "intermediate_size": 2 * HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "max_position_embeddings": CONTEXT_LENGTH,
        "tie_word_embeddings": True,
        "eos_token_id": config_eos,
        "pad_token_id": ids(spec.pad),
        # Qwen's config.json names <|endoftext|> as bos though its tokenizer adds none.
        "bos_token_id": ids(spec.bos or spec.pad),
        **spec.config,
    }
    name = {
        "Qwen2ForCausalLM": "Qwen2Config",
        "Qwen3ForCausalLM": "Qwen3Config",
        "LlamaForCausalLM": "LlamaConfig",
        "MistralForCausalLM": "MistralConfig",
        "GptOssForCausalLM": "GptOssConfig",
        "Gemma3ForCausalLM": "Gemma3TextConfig",
    }[spec.architecture]
    if spec.architecture == "Qwen3ForCausalLM":
        settings["head_dim"] = HEAD_DIM  # Qwen3's default (128) does not follow hidden/heads
    return getattr(transformers, name)(**settings)


def build_tiny_family(folder: Path, family: str, *, seed: int = 0) -> None:
    """Write the seeded tiny model of ``family`` to ``folder`` (HF layout, safetensors).

    Example:
        >>> build_tiny_family(Path("tiny-llama3"), "llama3", seed=1)
        >>> (Path("tiny-llama3") / "chat_template.jinja").is_file()
        True
    """
    import torch
    import transformers

    spec = FAMILIES.get(family)
    if spec is None:
        raise ValueError(f"unknown model family {family!r}: use one of {sorted(FAMILIES)}")
    tokenizer = _tokenizer(spec)
    tokenizer.chat_template = family_template(family)

    def ids(token: str | None) -> int | None:
        return None if token is None else int(tokenizer.convert_tokens_to_ids(token))

    config = _config(spec, ids, len(tokenizer))
    torch.manual_seed(seed)
    model = getattr(transformers, spec.architecture)(config)
    stop = [ids(token) for token in spec.stop]
    generation = model.generation_config
    generation.eos_token_id = stop if len(stop) > 1 else stop[0]
    generation.pad_token_id = ids(spec.pad)
    generation.bos_token_id = config.bos_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


__all__ = [
    "FAMILIES",
    "RECIPE_VERSION",
    "Family",
    "build_tiny_family",
    "family_fingerprint",
    "family_template",
]
