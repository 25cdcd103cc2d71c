"""Demonstrations as token sequences with tiny-random's tokenizer and tool template."""

from __future__ import annotations

import pytest
from sft_support import TOOLS, shop_record, tool_call

import art_core as art
from art_core.embedded import resolve_base_model
from art_core.engines.tokenizer import ChatTokenizer, load_chat_tokenizer
from art_core.gateway.prompts import PromptBuilder
from art_core.sft.data import Demonstration, chat_record_to_trajectory, chat_turns
from art_core.sft.render import SFTRenderer, recorded_calls
from art_core.training.sequences import TokenSequence, assemble_sequences


@pytest.fixture(scope="module")
def chat() -> ChatTokenizer:
    return load_chat_tokenizer(resolve_base_model("tiny-random"))


def spans(chat: ChatTokenizer, sequence: TokenSequence) -> list[str]:
    """The decoded runs of trained tokens."""
    runs: list[list[int]] = []
    for i, (token, trained) in enumerate(zip(sequence.token_ids, sequence.loss_mask, strict=True)):
        if trained:
            if i == 0 or not sequence.loss_mask[i - 1]:
                runs.append([])
            runs[-1].append(token)
    return [chat.tokenizer.decode(run, skip_special_tokens=False) for run in runs]


def demo(record: dict, label: str = "rec") -> Demonstration:
    return Demonstration(label, chat_record_to_trajectory(record))


def test_a_tool_conversation_is_one_sequence_as_the_gateway_would_prompt_it(
    chat: ChatTokenizer,
) -> None:
    renderer = SFTRenderer(chat)
    record = renderer.record(demo(shop_record()))
    (sequence,) = record.sequences
    assert spans(chat, sequence) == [
        '<tool_call>\n{"name": "get_price", "arguments": {"item": "pear"}}\n</tool_call><|im_end|>',
        "A pear costs 3.<|im_end|>",
    ]
    # The context before each answer is exactly the prompt the gateway would have run for
    # that request (the second one spliced onto the first call's ids, as in a rollout).
    builder = PromptBuilder(chat.tokenizer, chat.eos_token_ids)
    turns = chat_turns(demo(shop_record()))
    first = sequence.loss_mask.index(True)
    assert sequence.token_ids[:first] == builder.build(turns[0].messages, TOOLS)
    answer_end = first + sequence.loss_mask[first:].index(False)
    history = art.LLMCall(
        model="m",
        messages=turns[0].messages,
        tools=turns[0].tools,
        prompt_token_ids=sequence.token_ids[:first],
        completion_token_ids=sequence.token_ids[first:answer_end],
        logprobs=[0.0] * (answer_end - first),
        response_message=turns[0].answer,
    )
    second = answer_end + sequence.loss_mask[answer_end:].index(True)
    prompt = builder.build(turns[1].messages, turns[1].tools, history=[history])
    assert sequence.token_ids[:second] == prompt
    assert renderer.rendered == 1 and renderer.token_exact == 0


def test_last_turn_only_and_weight_zero(chat: ChatTokenizer) -> None:
    renderer = SFTRenderer(chat)
    (last,) = renderer.record(demo(shop_record()), assistant_turns="last").sequences
    assert spans(chat, last) == ["A pear costs 3.<|im_end|>"]
    record = shop_record()
    record["messages"][4]["weight"] = 0
    (first,) = renderer.record(demo(record)).sequences
    assert spans(chat, first) == [
        '<tool_call>\n{"name": "get_price", "arguments": {"item": "pear"}}\n</tool_call><|im_end|>'
    ]
    assert len(first) < len(last)  # nothing after the last trained token is kept


def test_plain_chat_and_an_empty_answer(chat: ChatTokenizer) -> None:
    renderer = SFTRenderer(chat)
    record = {
        "messages": [
            {"role": "user", "content": "Say nothing."},
            {"role": "assistant", "content": ""},
            {"role": "user", "content": "What is 12 times 7?"},
            {"role": "assistant", "content": [{"type": "text", "text": "84"}]},
        ]
    }
    (sequence,) = renderer.record(demo(record)).sequences
    assert spans(chat, sequence) == ["<|im_end|>", "84<|im_end|>"]


def test_over_the_context_is_an_error_naming_the_record(chat: ChatTokenizer) -> None:
    long = {
        "messages": [
            {"role": "user", "content": "word " * 3000},
            {"role": "assistant", "content": "ok"},
        ]
    }
    with pytest.raises(
        ValueError, match=r"demos\.jsonl:4: \d+ tokens, over the model's context of 2048"
    ):
        SFTRenderer(chat).record(demo(long, "demos.jsonl:4"))


def recorded(prompt: list[int], completion: list[int], index: int = 0, **kw) -> art.LLMCall:  # type: ignore[no-untyped-def]
    return art.LLMCall(
        model="m",
        messages=[{"role": "user", "content": "q"}],
        index=index,
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        logprobs=[-0.5] * len(completion),
        response_message={"role": "assistant", "content": "a"},
        **kw,
    )


def test_recorded_calls_are_used_token_exactly(chat: ChatTokenizer) -> None:
    first = recorded([5, 6], [7, 8])
    second = recorded([5, 6, 7, 8, 9], [10], index=1)
    branch = recorded([5, 11], [12], index=2)
    store = {call.id: call for call in (first, second, branch)}
    trajectory = art.Trajectory(calls=[first, second, branch])
    renderer = SFTRenderer(chat)
    record = renderer.record(Demonstration("r", trajectory), lookup=store.get)
    expected = assemble_sequences(trajectory.calls).sequences  # GRPO's assembly
    assert [(s.token_ids, s.loss_mask) for s in record.sequences] == [
        (s.token_ids, s.loss_mask) for s in expected
    ]
    assert renderer.token_exact == 1
    last = renderer.record(Demonstration("r", trajectory), lookup=store.get, assistant_turns="last")
    assert [(s.token_ids, s.loss_mask) for s in last.sequences] == [
        ([5, 11, 12], [False, False, True])
    ]
    # ART-style choices that carry the gateway's call ids are found the same way.
    choices = art.Trajectory(
        messages_and_choices=[
            {"role": "user", "content": "q"},
            {
                "finish_reason": "stop",
                "index": 0,
                "message": {"role": "assistant", "content": "a"},
                "call_id": first.id,
            },
        ]
    )
    assert recorded_calls(choices, store.get) == [first]
    # Calls this model did not record (another model's, a teacher's) are rendered instead.
    assert recorded_calls(trajectory, {first.id: first}.get) is None
    assert recorded_calls(trajectory, None) is None


def test_calls_of_another_model_are_rendered_per_call(chat: ChatTokenizer) -> None:
    """A teacher's calls carry text only: each call is a turn, in this model's template."""
    call = art.LLMCall(
        model="teacher",
        messages=[{"role": "user", "content": "How much is a pear?"}],
        tools=TOOLS,
        prompt_token_ids=[],
        completion_token_ids=[],
        logprobs=[],
        response_message=tool_call("get_price", '{"item":  "pear"}'),
    )
    other = call.model_copy(
        update={
            "id": "call_2",
            "index": 1,
            "messages": [{"role": "system", "content": "Be brief."}],
            "tools": None,
            "response_message": {"role": "assistant", "content": "ok"},
        }
    )
    record = SFTRenderer(chat).record(Demonstration("t", art.Trajectory(calls=[call, other])))
    assert [spans(chat, s) for s in record.sequences] == [
        [
            '<tool_call>\n{"name": "get_price", "arguments": {"item": "pear"}}\n</tool_call><|im_end|>'
        ],
        ["ok<|im_end|>"],
    ]
