"""Stand-in base models: tiny-random fine-tuned (plain supervised steps) to answer in a format.

tiny-random answers noise, and its near-uniform logits make even greedy answers depend on how
the engine batched a request. A test that needs a model that *writes in a format* (a game's
``<move>left</move>``, a short non-empty sentence) fine-tunes it on conversations in that
format: the result knows the format, not the task, like the instruct models the code under
test was written for. Built once per recipe into the embedded-models folder
(``ART_CORE_MODELS_DIR``), seeded, so runs reuse it.

Example:
    >>> folder = fine_tuned_stand_in("stand-in-chat", [[{"role": "user", "content": "hi"},
    ...     {"role": "assistant", "content": "Hello!"}]], steps=50)  # too slow for a docstring: 50 training steps  # doctest: +SKIP
    >>> art.TrainableModel(name="m", base_model=str(folder))  # too slow for a docstring  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

from art_core.embedded import models_dir, resolve_base_model


def _labelled(
    tokenizer: Any, conversation: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
) -> tuple[list[int], list[int]]:
    """Token ids of a conversation, and labels that train its assistant turns only (not
    those with ``"weight": 0``, OpenAI's fine-tuning convention for context turns)."""
    clean = [{k: v for k, v in message.items() if k != "weight"} for message in conversation]
    ids = _ids(tokenizer.apply_chat_template(clean, tools=tools, tokenize=True))
    labels = [-100] * len(ids)
    for end, message in enumerate(conversation, start=1):
        if message["role"] != "assistant" or message.get("weight", 1) == 0:
            continue
        prompt = _ids(
            tokenizer.apply_chat_template(
                clean[: end - 1], tools=tools, add_generation_prompt=True, tokenize=True
            )
        )
        upto = _ids(tokenizer.apply_chat_template(clean[:end], tools=tools, tokenize=True))
        assert ids[: len(upto)] == upto and upto[: len(prompt)] == prompt
        labels[len(prompt) : len(upto)] = upto[len(prompt) :]
    return ids, labels


def _ids(encoded: Any) -> list[int]:
    """apply_chat_template's ids, whether it answered a list or a dict of encodings."""
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def fine_tuned_stand_in(
    name: str,
    conversations: list[list[dict[str, Any]]],
    *,
    steps: int = 150,
    learning_rate: float = 3e-3,
    seed: int = 0,
    context: int = 8192,
    base: str = "tiny-random",
    tools: list[dict[str, Any]] | None = None,
) -> Path:
    """``base`` (an embedded tiny model: ``tiny-random``, ``tiny-qwen3``...) fine-tuned on
    ``conversations`` (their assistant turns, rendered with ``tools``), saved once.

    Returns the model folder, usable as a ``base_model`` path. ``context`` raises the
    model's position limit (RoPE: nothing learned changes) so whole games fit.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    recipe = json.dumps(
        [conversations, steps, learning_rate, seed, context]
        + ([base, tools] if (base, tools) != ("tiny-random", None) else []),
        sort_keys=True,
    )
    digest = hashlib.sha256(recipe.encode()).hexdigest()[:12]
    target = models_dir() / f"{name}-{digest}"
    if (target / "config.json").exists():
        return target
    base_path = resolve_base_model(base)
    tokenizer = AutoTokenizer.from_pretrained(base_path)
    torch.manual_seed(seed)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            base_path, dtype=torch.float32, attn_implementation="sdpa"
        )
    except ValueError:  # an architecture without SDPA attention (gpt-oss)
        model = AutoModelForCausalLM.from_pretrained(
            base_path, dtype=torch.float32, attn_implementation="eager"
        )
    examples = [_labelled(tokenizer, c, tools) for c in conversations]
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
    order = random.Random(seed)
    model.train()
    for _ in range(steps):  # one whole conversation per step: no padding, no mask
        ids, labels = order.choice(examples)
        loss = model(input_ids=torch.tensor([ids]), labels=torch.tensor([labels])).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.config.max_position_embeddings = context
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        staging.rename(target)  # atomic: a half-written stand-in is never picked up
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not (target / "config.json").exists():
            raise
    return target
