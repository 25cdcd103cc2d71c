"""``tiny-random``: a seeded, tiny Llama model with its own small BPE tokenizer, built offline.

It exists for fast tests: a real ``LlamaForCausalLM`` (2 layers, hidden size 64) whose weights
depend only on the seed, with a ChatML tokenizer trained in milliseconds on a corpus shipped
in the package. Its answers are noise, but every code path (chat template, tools, grammar,
LoRA, training) runs as on a real model.
"""

from __future__ import annotations

from pathlib import Path

from art_core.embedded.templates import tool_chat_template

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE = 1024


def build_tiny_random(folder: Path, *, seed: int = 0) -> None:
    """Write a seeded tiny Llama model and tokenizer to ``folder`` (HF layout, safetensors).

    Example:
        >>> build_tiny_random(Path("tiny"), seed=0)
        >>> (Path("tiny") / "config.json").is_file()
        True
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    corpus = (Path(__file__).parent / "corpus.txt").read_text(encoding="utf-8")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus.splitlines(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
    )
    tokenizer.chat_template = tool_chat_template()

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
