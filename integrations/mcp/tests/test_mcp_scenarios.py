"""``generate_scenarios`` against a local OpenAI-compatible stand-in; scenario JSONL files."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from art_mcp import (
    Scenario,
    ScenarioGenerationError,
    generate_scenarios,
    load_scenarios,
    save_scenarios,
)
from art_mcp.generate import parse_reply
from mcp_support import FAULTY_STDIO, generator_reply

from art_core.testing.judge import StandInJudge


@pytest.fixture(scope="module")
def generator() -> Iterator[StandInJudge]:
    with StandInJudge() as server:
        yield server


async def test_generated_scenarios_are_valid_distinct_and_batched(generator: StandInJudge) -> None:
    generator.reset()
    generator.script = [generator_reply(duplicates=True)] * 10
    scenarios = await generate_scenarios(
        FAULTY_STDIO, 7, generator_model="gen", generator_base_url=generator.base_url, batch_size=4
    )
    assert len(scenarios) == 7
    assert len({s.task for s in scenarios}) == 7 and len({s.id for s in scenarios}) == 7
    assert all(1 <= s.difficulty <= 5 for s in scenarios)
    # every tool of the server was described to the generator, with its parameters
    first = generator.requests[0]
    prompt = first["messages"][-1]["content"]
    for tool in ["lookup", "add", "explode", "hang", "big", "crash"]:
        assert f"- {tool}: " in prompt
    assert '"enum": ["France", "Japan", "Peru"]' in prompt and "notes://readme" in prompt
    assert first["response_format"]["type"] == "json_schema"
    assert "Write 4 new, distinct tasks" in prompt
    # later requests list what exists, ask only for what is missing, and duplicates were dropped
    assert len(generator.requests) >= 3
    assert "Tasks already written" in generator.requests[1]["messages"][-1]["content"]
    tasks = [s.task for s in scenarios]
    assert tasks.count("Use lookup to answer question number 0.") == 1


async def test_malformed_generator_output_is_rejected_with_a_clear_error(
    generator: StandInJudge,
) -> None:
    generator.reset()
    generator.script = ["not_json"] * 3
    with pytest.raises(ScenarioGenerationError, match=r"after 3 attempts.*not JSON"):
        await generate_scenarios(
            FAULTY_STDIO, 3, generator_model="gen", generator_base_url=generator.base_url
        )
    assert len(generator.requests) == 3

    generator.reset()
    bad = json.dumps({"scenarios": [{"task": "Look up the capital of Peru", "difficulty": 9}]})
    generator.script = [lambda body: bad] * 2
    with pytest.raises(
        ScenarioGenerationError, match="scenarios/0/difficulty: 9 is greater than the maximum of 5"
    ):
        await generate_scenarios(
            FAULTY_STDIO,
            3,
            generator_model="gen",
            generator_base_url=generator.base_url,
            max_attempts=2,
        )


async def test_one_bad_reply_is_retried(generator: StandInJudge) -> None:
    generator.reset()
    generator.script = [lambda body: '{"scenarios": "nope"}', generator_reply()]
    scenarios = await generate_scenarios(
        FAULTY_STDIO, 2, generator_model="gen", generator_base_url=generator.base_url
    )
    assert len(scenarios) == 2 and len(generator.requests) == 2


def test_parse_reply_accepts_fences_and_names_problems() -> None:
    fenced = 'Sure!\n```json\n{"scenarios": [{"task": "Add 2 and 3 please", "difficulty": 1}]}\n```'
    assert [s.task for s in parse_reply(fenced)] == ["Add 2 and 3 please"]
    with pytest.raises(ScenarioGenerationError, match="is empty"):
        parse_reply("  ")
    with pytest.raises(ScenarioGenerationError, match="'task' is a required property"):
        parse_reply('{"scenarios": [{"difficulty": 1}]}')
    with pytest.raises(ScenarioGenerationError, match="Additional properties"):
        parse_reply('{"scenarios": [{"task": "Add 2 and 3 please", "difficulty": 1, "x": 1}]}')


def test_scenarios_round_trip_through_jsonl_and_bad_lines_are_named(tmp_path: Path) -> None:
    scenarios = [
        Scenario(task="What is the capital of Peru?", difficulty=1, answer="Lima"),
        Scenario(task="Add 2 and 40", difficulty=2, answer="42", metadata={"source": "hand"}),
    ]
    path = save_scenarios(scenarios, tmp_path / "s.jsonl")
    assert load_scenarios(path) == scenarios

    edited = tmp_path / "edited.jsonl"
    edited.write_text('# comment\n"Just a task as a string"\n\n{"task": "x", "difficulty": 7}\n')
    with pytest.raises(
        ValueError, match=r"edited.jsonl:4: not a valid scenario.*less than or equal to 5"
    ):
        load_scenarios(edited)
    edited.write_text('"Same task"\n"same task!"\n')
    with pytest.raises(ValueError, match=r"edited.jsonl:2: scenario id .* repeats line 1"):
        load_scenarios(edited)
    with pytest.raises(FileNotFoundError):
        load_scenarios(tmp_path / "missing.jsonl")


def test_tasks_that_differ_only_in_symbols_are_different_scenarios() -> None:
    # A procedural arithmetic generator's tasks differ in their operators and signs: each
    # must keep an id of its own (ids name scenarios in the sampler's history).
    tasks = ["Calculate -3 - 6.", "Calculate -( -( 3 * 6 ) ).", "Calculate 3 + 6.", "calculate 3+6"]
    ids = [Scenario(task=task).id for task in tasks]
    assert len(set(ids)) == 4
    # Case, spacing and sentence punctuation still make no difference.
    assert (
        Scenario(task="What time is it in Tokyo?").id
        == Scenario(task="what time is it  in tokyo").id
    )
