"""Tool-call formats of each model family, on text and under their own grammars.

Every format's forced-call grammar is sampled at random under llguidance's token mask (with a
tokenizer carrying the family's markup tokens, special where the family's are): whatever is
sampled, it parses back into valid calls of the offered tools. Streaming never sends text the
whole answer does not have.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from art_core.chat_formats import chat_format_for
from art_core.chat_formats.format import ChatFormat
from art_core.embedded import resolve_base_model

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer", "minimum": 1, "maximum": 9},
                    "unit": {"enum": ["c", "f"]},
                },
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "send",
            "parameters": {
                "type": "object",
                "properties": {"to": {"type": "string"}, "urgent": {"type": "boolean"}},
                "required": ["to", "urgent"],
                "additionalProperties": False,
            },
        },
    },
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}

# (parser, special markup tokens, plain added tokens, reasoning parser)
FAMILIES = {
    "hermes-text": ("hermes", [], [], None),
    "qwen2.5": ("hermes", [], ["<tool_call>", "</tool_call>"], None),
    "qwen3": (
        "hermes",
        [],
        ["<tool_call>", "</tool_call>", "<think>", "</think>", "<|end|>"],
        "qwen3",
    ),
    "qwen3-coder": ("qwen3_coder", [], ["<tool_call>", "</tool_call>"], None),
    "llama3": ("llama3_json", ["<|python_tag|>", "<|eot_id|>"], [], None),
    "mistral": ("mistral", ["[TOOL_CALLS]"], [], None),
    "mistral-args": ("mistral_args", ["[TOOL_CALLS]", "[ARGS]"], [], None),
    "gpt-oss": (
        "openai",
        [
            "<|start|>",
            "<|end|>",
            "<|message|>",
            "<|channel|>",
            "<|constrain|>",
            "<|call|>",
            "<|return|>",
        ],
        [],
        None,
    ),
}


def family_format(family: str) -> tuple[Any, ChatFormat]:
    from transformers import AutoTokenizer

    parser, special, plain, reasoning = FAMILIES[family]
    tokenizer = AutoTokenizer.from_pretrained(resolve_base_model("tiny-random"))
    if special:
        tokenizer.add_special_tokens({"additional_special_tokens": special})
    if plain:
        tokenizer.add_tokens(plain)
    return tokenizer, chat_format_for(
        tokenizer, tool_call_parser=parser, reasoning_parser=reasoning or "none"
    )


# Text that closes what a forced call opened: a random walk leans towards writing them.
CLOSERS = [
    '"',
    "}",
    "]",
    "\n</parameter>\n",
    "</function>\n",
    "\n</tool_call>",
    "</think>",
    "<|end|>",
]


def _begun(text: str, closer: str) -> int:
    """How much of ``closer`` the end of ``text`` has written."""
    return max(k for k in range(len(closer), -1, -1) if text.endswith(closer[:k]))


def sample_under(
    grammar: str, tokenizer: Any, rng: random.Random, limit: int = 400
) -> list[int] | None:
    """Random ids the grammar allows, leaning (after a while) towards tokens that continue
    a closing text, so a random walk ends; None when it did not end within ``limit``."""
    import llguidance
    import llguidance.hf
    import llguidance.torch
    import torch

    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ll = llguidance.hf.from_tokenizer(tokenizer, n_vocab=len(tokenizer), eos_token=[eos])
    matcher = llguidance.LLMatcher(ll, grammar, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    texts = [tokenizer.decode([i]) for i in range(len(tokenizer))]
    # Answers are parsed as text: a special token's markup spelled out as text pieces inside
    # a value ("<|" "end" "|>" in a JSON string) would read as the token. Real models write
    # the token where markup goes; a walk that spells one out is dropped (a known limit of
    # parsing text; the grammar itself never lets a special token into a value).
    specials = set(tokenizer.all_special_ids)
    spelled_markup = [texts[i] for i in specials if len(texts[i]) > 2]
    text_closers = [c for c in CLOSERS if c not in spelled_markup]
    ids: list[int] = []
    text = ""
    plain = ""  # the text with special tokens blanked out
    bitmask = llguidance.torch.allocate_token_bitmask(1, len(tokenizer))
    for step in range(limit):
        llguidance.torch.fill_next_token_bitmask(matcher, bitmask, 0)
        bits = (bitmask[0].unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
        allowed = bits.flatten()[: len(tokenizer)].nonzero().flatten().tolist()
        if eos in allowed and (rng.random() < 0.7 or len(allowed) == 1):
            return ids
        allowed = [i for i in allowed if i != eos] or allowed
        leaning: list[int] = []
        whole = [i for i in allowed if len(texts[i]) > 2 and texts[i] in CLOSERS]
        if step > 8 and whole and rng.random() < 0.5:
            leaning = whole  # a closing token (</think>, <|end|>) written at once
        elif step > 8 and rng.random() < 0.8:
            # Continue the closing text already begun the furthest (any, when none is).
            for done, closer in sorted(
                ((_begun(text, c), c) for c in rng.sample(text_closers, len(text_closers))),
                key=lambda d: -d[0],
            ):
                rest = closer[done:]
                leaning = [i for i in allowed if texts[i] and rest.startswith(texts[i])]
                if leaning:
                    break
        token = rng.choice(leaning or allowed)
        if token not in specials and any(m in plain + texts[token] for m in spelled_markup):
            return None  # special markup spelled out as text: not what a model writes
        assert matcher.consume_token(token), matcher.get_error()
        ids.append(token)
        text += texts[token]
        plain += "\x00" if token in specials else texts[token]
    return None


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("parallel", [False, True])
def test_every_forced_call_parses_into_valid_calls(family: str, parallel: bool) -> None:
    tokenizer, chat_format = family_format(family)
    rng = random.Random(f"{family}-{parallel}")
    opened = [False, True] if chat_format.reasoning else [False]
    finished = 0
    for attempt in range(24):
        opened_reasoning = opened[attempt % len(opened)]
        grammar = chat_format.tool_call_grammar(
            TOOLS, parallel=parallel, opened_reasoning=opened_reasoning
        )
        ids = sample_under(grammar, tokenizer, rng)
        if ids is None:
            continue
        finished += 1
        text = chat_format.decode(ids, parses_tools=True)
        parsed = chat_format.parse(
            text, TOOLS, parses_tools=True, opened_reasoning=opened_reasoning
        )
        assert parsed.tool_calls, (family, text)
        assert not parsed.truncated and parsed.parser == chat_format.name, text
        if not parallel:
            assert len(parsed.tool_calls) == 1, text
        for call in parsed.tool_calls:
            name = call["function"]["name"]
            jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[name])
    assert finished >= 12, f"only {finished} of 24 random walks ended"


ANSWERS = {
    "qwen2.5": [
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "Plain answer, no call.",
        '```json\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n```',
    ],
    "qwen3": [
        '<think>\nThe user wants weather.\n</think>\n\n<tool_call>\n{"name": "send", "arguments": {"to": "a", "urgent": true}}\n</tool_call>',
        "<think>\nshort</think>\n\nHello there",
    ],
    "qwen3-coder": [
        "I will.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Jose\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
    ],
    "llama3": [
        '{"name": "get_weather", "parameters": {"city": "Rome", "days": 2}}',
        '<|python_tag|>{"name": "send", "parameters": {"to": "x", "urgent": false}}; {"name": "get_weather", "parameters": {"city": "Rome"}}',
        "{not json at all",
        "The answer is 4.",
    ],
    "mistral": [
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Lyon"}}, {"name": "send", "arguments": {"to": "b", "urgent": true}}]',
        "Just text.",
    ],
    "mistral-args": [
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Nice"}[TOOL_CALLS]send[ARGS]{"to": "c", "urgent": false}'
    ],
    "gpt-oss": [
        '<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Bern"}<|call|>',
        "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>It is 4.<|return|>",
    ],
}


def _answers() -> list[tuple[str, str]]:
    return [(family, text) for family, texts in ANSWERS.items() for text in texts]


@pytest.mark.parametrize(("family", "text"), _answers())
def test_streamed_parts_are_prefixes_of_the_whole_answer(family: str, text: str) -> None:
    tokenizer, chat_format = family_format(family)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    whole_text = chat_format.decode(ids, parses_tools=True)
    whole = chat_format.parse(whole_text, TOOLS, parses_tools=True, opened_reasoning=False)
    for end in range(1, len(ids) + 1):
        partial = chat_format.decode(ids[:end], parses_tools=True)
        reasoning, content = chat_format.stream_split(
            partial, parses_tools=True, opened_reasoning=False
        )
        assert (whole.content or "").startswith(content), (partial, content, whole.content)
        assert (whole.reasoning or "").startswith(reasoning or ""), (partial, reasoning)


def test_answers_parse_into_their_calls() -> None:
    parsed = {
        (family, i): family_format(family)[1].parse(
            text, TOOLS, parses_tools=True, opened_reasoning=False
        )
        for family, texts in ANSWERS.items()
        for i, text in enumerate(texts)
    }

    def calls(key: tuple[str, int]) -> list[tuple[str, Any]]:
        return [
            (c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in parsed[key].tool_calls
        ]

    assert calls(("qwen2.5", 0)) == [("get_weather", {"city": "Paris"})]
    assert parsed[("qwen2.5", 0)].content == "Let me check."
    assert parsed[("qwen2.5", 1)].tool_calls == [] and parsed[("qwen2.5", 1)].parser is None
    # The lenient fallback reads a fenced bare call, and says so.
    assert calls(("qwen2.5", 2)) == [("get_weather", {"city": "Oslo"})]
    assert parsed[("qwen2.5", 2)].parser == "bare_json"
    assert parsed[("qwen3", 0)].reasoning == "The user wants weather."
    assert calls(("qwen3", 0)) == [("send", {"to": "a", "urgent": True})]
    assert parsed[("qwen3", 1)].content == "Hello there"
    assert calls(("qwen3-coder", 0)) == [("get_weather", {"city": "San Jose", "days": 3})]
    assert parsed[("qwen3-coder", 0)].content == "I will."
    assert calls(("llama3", 0)) == [("get_weather", {"city": "Rome", "days": 2})]
    assert [n for n, _ in calls(("llama3", 1))] == ["send", "get_weather"]
    assert parsed[("llama3", 2)].content == "{not json at all"
    assert parsed[("llama3", 3)].content == "The answer is 4."
    assert [n for n, _ in calls(("mistral", 0))] == ["get_weather", "send"]
    assert all(len(c["id"]) == 9 and c["id"].isalnum() for c in parsed[("mistral", 0)].tool_calls)
    assert calls(("mistral-args", 0)) == [
        ("get_weather", {"city": "Nice"}),
        ("send", {"to": "c", "urgent": False}),
    ]
    assert calls(("gpt-oss", 0)) == [("get_weather", {"city": "Bern"})]
    assert parsed[("gpt-oss", 0)].reasoning == "Need weather."
    assert parsed[("gpt-oss", 1)].content == "It is 4."
    assert parsed[("gpt-oss", 1)].reasoning == "Easy."


@pytest.mark.parametrize(
    ("family", "text"),
    [
        ("qwen2.5", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa'),
        ("qwen3-coder", "<tool_call>\n<function=get_weather>\n<parameter=city>\nPa"),
        ("llama3", '{"name": "get_weather", "parameters": {"city": "Pa'),
        ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Pa'),
        ("mistral-args", '[TOOL_CALLS]get_weather[ARGS]{"city": "Pa'),
        (
            "gpt-oss",
            '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Pa',
        ),
    ],
)
def test_a_call_cut_by_max_tokens_is_a_truncated_call_of_its_tool(family: str, text: str) -> None:
    _, chat_format = family_format(family)
    parsed = chat_format.parse(text, TOOLS, parses_tools=True, opened_reasoning=False)
    assert parsed.truncated and parsed.content is None
    [call] = parsed.tool_calls
    assert call["function"]["name"] == "get_weather"


def test_a_call_of_an_unknown_tool_stays_content() -> None:
    for family, text in [
        ("qwen2.5", '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'),
        ("llama3", '{"name": "rm_rf", "parameters": {}}'),
        ("mistral", '[TOOL_CALLS][{"name": "rm_rf", "arguments": {}}]'),
    ]:
        parsed = family_format(family)[1].parse(
            text, TOOLS, parses_tools=True, opened_reasoning=False
        )
        assert parsed.tool_calls == [] and parsed.content == text, family


def test_a_named_parser_wins_and_an_unknown_name_is_refused(tmp_path: Path) -> None:
    tokenizer, _ = family_format("hermes-text")
    assert chat_format_for(tokenizer, tool_call_parser="llama3_json").name == "llama3_json"
    with pytest.raises(ValueError, match="unknown tool_call_parser 'nope'"):
        chat_format_for(tokenizer, tool_call_parser="nope")


def test_a_strict_tool_closes_every_object_of_its_schema() -> None:
    """OpenAI's strict mode and Anthropic's strict tools: a forced call names only declared
    keys (a schema that says otherwise keeps its own word)."""
    from art_core.chat_formats.schemas import closed, parameters_of

    schema = {
        "type": "object",
        "properties": {
            "where": {"type": "object", "properties": {"city": {"type": "string"}}},
            "tags": {"type": "array", "items": {"type": "object"}},
            "extra": {"type": "object", "additionalProperties": True},
        },
        "$defs": {"P": {"properties": {"x": {"const": {"type": "object"}}}}},
    }
    out = closed(schema)
    assert out["additionalProperties"] is False
    assert out["properties"]["where"]["additionalProperties"] is False
    assert out["properties"]["tags"]["items"]["additionalProperties"] is False
    assert out["properties"]["extra"]["additionalProperties"] is True
    assert out["$defs"]["P"]["additionalProperties"] is False
    assert out["$defs"]["P"]["properties"]["x"]["const"] == {"type": "object"}  # data, kept
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    assert parameters_of(tool) is schema  # not strict: as given
    strict = {"type": "function", "function": {"name": "f", "parameters": schema, "strict": True}}
    assert parameters_of(strict) == out


def test_a_bare_call_naming_no_tool_is_the_one_its_arguments_fit() -> None:
    """What Qwen2.5-Coder-0.5B writes under Claude Code: a made-up name, the arguments of one
    declared tool. The call is that tool's, marked as renamed; a call whose arguments fit no
    tool, or several, stays text, as does one naming no tool inside the model's own markup."""
    _, chat_format = family_format("qwen2.5")

    def parse(text: str) -> Any:
        return chat_format.parse(text, TOOLS, parses_tools=True, opened_reasoning=False)

    renamed = parse(
        '```json\n{"name": "weather_now", "arguments": {"city": "Oslo", "days": 2}}\n```'
    )
    [call] = renamed.tool_calls
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo", "days": 2}
    assert renamed.parser == "bare_json_renamed"
    # Its own name known: plain bare JSON, not renamed.
    assert parse('{"name": "send", "arguments": {"to": "a", "urgent": true}}').parser == "bare_json"
    for text in (
        '{"name": "notify", "arguments": {"to": "a"}}',  # send needs `urgent` too
        '{"name": "mystery", "arguments": {"city": "Oslo", "to": "a"}}',  # fits neither
        '{"name": "mystery", "arguments": {}}',  # no arguments say which
        '<tool_call>\n{"name": "weather_now", "arguments": {"city": "Oslo"}}\n</tool_call>',
    ):
        parsed = parse(text)
        assert parsed.tool_calls == [] and parsed.content == text, text
