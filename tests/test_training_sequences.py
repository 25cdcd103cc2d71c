"""Token-exact sequence assembly from recorded calls (a multi-turn tool rollout and branches)."""

from __future__ import annotations

import json

import pytest
from rollout_checks import WEATHER_TOOL
from transformers import AutoTokenizer

from art_core.embedded import resolve_base_model
from art_core.training.sequences import TokenSequence, assemble_sequences
from art_core.trajectories import LLMCall


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    return AutoTokenizer.from_pretrained(resolve_base_model("tiny-random"))


def encode(tokenizer, text: str) -> list[int]:  # type: ignore[no-untyped-def]
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def logprobs_for(ids: list[int], offset: float) -> list[float]:
    # Distinct, recognizable values so a test can tell which call a logprob came from.
    return [-(offset + i / 100) for i in range(len(ids))]


def test_multi_turn_tool_rollout_trains_only_on_sampled_completions(tokenizer) -> None:  # type: ignore[no-untyped-def]
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    prompt1 = list(
        tokenizer.apply_chat_template(
            messages, tools=[WEATHER_TOOL], add_generation_prompt=True, tokenize=True
        )["input_ids"]
    )
    tool_call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    completion1 = [*encode(tokenizer, tool_call), tokenizer.convert_tokens_to_ids("<|im_end|>")]
    tool_turn = encode(
        tokenizer,
        "\n<|im_start|>user\n<tool_response>\n"
        + json.dumps({"temp_c": 18})
        + "\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
    )
    prompt2 = prompt1 + completion1 + tool_turn
    completion2 = [
        *encode(tokenizer, "It is 18 C in Paris."),
        tokenizer.convert_tokens_to_ids("<|im_end|>"),
    ]
    follow_up = encode(tokenizer, "\n<|im_start|>user\nThanks!<|im_end|>\n<|im_start|>assistant\n")
    prompt3 = prompt2 + completion2 + follow_up
    completion3 = encode(tokenizer, "You are welcome.")
    calls = [
        LLMCall(
            model="tiny",
            messages=messages,
            index=i,
            prompt_token_ids=prompt,
            completion_token_ids=completion,
            logprobs=logprobs_for(completion, offset=i + 1),
        )
        for i, (prompt, completion) in enumerate(
            [(prompt1, completion1), (prompt2, completion2), (prompt3, completion3)]
        )
    ]

    assembled = assemble_sequences(reversed(calls))  # recorded order is restored from .index

    assert assembled.breaks == 0
    [seq] = assembled.sequences
    assert seq.token_ids == prompt3 + completion3
    assert seq.call_ids == [call.id for call in calls]
    expected_mask = (
        [False] * len(prompt1)
        + [True] * len(completion1)
        + [False] * len(tool_turn)
        + [True] * len(completion2)
        + [False] * len(follow_up)
        + [True] * len(completion3)
    )
    assert seq.loss_mask == expected_mask
    trained = [
        (t, lp) for t, m, lp in zip(seq.token_ids, seq.loss_mask, seq.logprobs, strict=True) if m
    ]
    assert [t for t, _ in trained] == completion1 + completion2 + completion3
    assert [lp for _, lp in trained] == calls[0].logprobs + calls[1].logprobs + calls[2].logprobs
    # Context (system prompt, tool result, user turn) carries no logprob.
    assert all(lp == 0.0 for lp, m in zip(seq.logprobs, seq.loss_mask, strict=True) if not m)
    # The tool result's tokens are context, never trained.
    decoded_context = tokenizer.decode(
        [t for t, m in zip(seq.token_ids, seq.loss_mask, strict=True) if not m]
    )
    assert "<tool_response>" in decoded_context and "temp_c" in decoded_context
    assert "<tool_response>" not in tokenizer.decode([t for t, _ in trained])


def call(prompt: list[int], completion: list[int], index: int, choice: int = 0) -> LLMCall:
    return LLMCall(
        model="m",
        messages=[],
        index=index,
        choice_index=choice,
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        logprobs=[-0.5] * len(completion),
    )


def test_interleaved_branches_each_extend_their_own_sequence() -> None:
    calls = [
        call([1, 2], [3], index=0),  # branch A
        call([7, 8], [9], index=1),  # branch B (a sub-agent with its own prompt)
        call([1, 2, 3, 4], [5], index=2),  # continues A, although B was called last
        call([7, 8, 9, 10], [11], index=3),  # continues B
    ]
    out = assemble_sequences(calls)
    assert [s.token_ids for s in out.sequences] == [[1, 2, 3, 4, 5], [7, 8, 9, 10, 11]]
    assert [s.loss_mask for s in out.sequences] == [[False, False, True, False, True]] * 2
    assert out.breaks == 1  # B could not extend A


def test_rewritten_history_starts_a_new_sequence_and_counts_a_break() -> None:
    # The template dropped an earlier turn: call 2's prompt does not start with call 1's ids.
    out = assemble_sequences([call([1, 2], [3, 4], 0), call([1, 2, 99, 5], [6], 1)])
    assert out.breaks == 1
    assert [s.token_ids for s in out.sequences] == [[1, 2, 3, 4], [1, 2, 99, 5, 6]]
    # The new sequence trains only on its own completion; [3, 4] are not trained twice.
    assert out.sequences[1].loss_mask == [False, False, False, False, True]
    assert out.num_trainable_tokens == 3


def test_sibling_choices_are_separate_sequences_but_not_breaks() -> None:
    out = assemble_sequences([call([1, 2], [3], 0, choice=0), call([1, 2], [4], 0, choice=1)])
    assert out.breaks == 0
    assert [s.token_ids for s in out.sequences] == [[1, 2, 3], [1, 2, 4]]


def test_longest_matching_sequence_is_extended() -> None:
    calls = [call([1], [2], 0), call([1, 2], [3], 1, choice=0), call([1], [5], 0, choice=1)]
    out = assemble_sequences(calls)
    # call(index=1) extends [1, 2] (choice 0 of index 0), not the sibling [1, 5].
    assert [s.token_ids for s in out.sequences] == [[1, 2, 3], [1, 5]]


def test_invalid_calls_are_rejected_with_the_call_id() -> None:
    bad = LLMCall(
        model="m", messages=[], prompt_token_ids=[1], completion_token_ids=[2, 3], logprobs=[-1.0]
    )
    with pytest.raises(ValueError, match=f"call {bad.id}: 2 completion tokens but 1 logprobs"):
        assemble_sequences([bad])
    positive = bad.model_copy(update={"completion_token_ids": [2], "logprobs": [0.5]})
    with pytest.raises(ValueError, match="finite and <= 0"):
        assemble_sequences([positive])
    empty = bad.model_copy(update={"prompt_token_ids": [], "logprobs": [-1.0, -1.0]})
    with pytest.raises(ValueError, match="empty prompt_token_ids"):
        assemble_sequences([empty])
    with pytest.raises(ValueError, match="same length"):
        TokenSequence([1, 2], [False], [0.0, 0.0])
