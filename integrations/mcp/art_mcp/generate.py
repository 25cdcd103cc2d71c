"""``generate_scenarios``: ask any OpenAI-compatible model for tasks an MCP server can solve.

The generator sees the server's tools (names, descriptions, parameters) and resources, and
answers with JSON that must match ``SCENARIOS_SCHEMA``. Replies are validated (a bad one is
retried, then reported naming what was wrong), duplicate tasks are dropped, and requests go on
until there are ``num_scenarios`` distinct tasks.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import jsonschema
import mcp_types

from art_mcp.scenarios import Scenario, dedupe, normalize_task
from art_mcp.servers import ServerLike, parse_server
from art_mcp.session import connect
from art_mcp.tools import input_schema_to_parameters

logger = logging.getLogger(__name__)

SCENARIOS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "scenarios": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "properties": {
                    "task": {"type": "string", "minLength": 8, "maxLength": 2000},
                    "difficulty": {"type": "integer", "minimum": 1, "maximum": 5},
                },
                "required": ["task", "difficulty"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["scenarios"],
    "additionalProperties": False,
}

# What is sent as ``response_format``: the same shape without the bounds (minLength, minimum,
# ...) that OpenAI's strict mode rejects; the bounds are checked on the reply instead.
RESPONSE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "scenarios": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"task": {"type": "string"}, "difficulty": {"type": "integer"}},
                "required": ["task", "difficulty"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["scenarios"],
    "additionalProperties": False,
}

SYSTEM_PROMPT = (
    "You write training tasks for an AI agent. The agent can only act through the tools of "
    "one MCP server, listed below. Every task you write must be solvable with those tools "
    "alone, self-contained (state every value the agent needs), realistic, and phrased the way "
    "a user would ask. Vary the tools used, the wording and the difficulty: 1 = one obvious "
    "tool call, 3 = a few calls or some reasoning about the results, 5 = several dependent "
    "calls. Reply with JSON only."
)


class ScenarioGenerationError(RuntimeError):
    """The generator's replies were unusable (not JSON, wrong shape) or the request failed."""


def describe_tools(tools: list[mcp_types.Tool], resources: list[mcp_types.Resource]) -> str:
    """The tools and resources as the compact text the generator reads.

    Example:
        >>> describe_tools([mcp_types.Tool(name="add", description="Add", inputSchema={"type": "object"})], [])
        '## Tools\\n- add: Add\\n  parameters: {"type": "object", "properties": {}}'
    """
    lines = ["## Tools"]
    for tool in tools:
        parameters = json.dumps(input_schema_to_parameters(tool.input_schema))
        lines.append(f"- {tool.name}: {(tool.description or tool.title or '').strip()}")
        lines.append(f"  parameters: {parameters}")
    if resources:
        lines.append("## Resources")
        for resource in resources:
            lines.append(f"- {resource.uri}: {resource.description or resource.name}")
    return "\n".join(lines)


def parse_reply(content: str | None) -> list[Scenario]:
    """The scenarios of one generator reply; ``ScenarioGenerationError`` says what is wrong.

    A reply wrapped in a ```json fence is accepted.

    Example:
        >>> [s.task for s in parse_reply('{"scenarios": [{"task": "What time is it in Lima?", "difficulty": 1}]}')]
        ['What time is it in Lima?']
    """
    if not content or not content.strip():
        raise ScenarioGenerationError("the generator's reply is empty")
    text = content.strip()
    fenced = re.search(r"```(?:json)?\s*(.*?)```", text, re.DOTALL)
    if fenced:
        text = fenced.group(1).strip()
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScenarioGenerationError(
            f"the generator's reply is not JSON ({exc.msg} at character {exc.pos}); "
            f"it starts with {content.strip()[:120]!r}"
        ) from None
    errors = sorted(
        jsonschema.Draft202012Validator(SCENARIOS_SCHEMA).iter_errors(value),
        key=lambda e: list(e.absolute_path),
    )
    if errors:
        where = "/".join(str(p) for p in errors[0].absolute_path) or "(top level)"
        raise ScenarioGenerationError(
            f"the generator's reply does not match the scenario schema at {where}: "
            f"{errors[0].message}"
            + (f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else "")
        )
    return [
        Scenario(task=item["task"], difficulty=item["difficulty"]) for item in value["scenarios"]
    ]


def _request_prompt(
    catalog: str, count: int, instructions: str | None, existing: list[Scenario]
) -> str:
    parts = [catalog, ""]
    if instructions:
        parts += ["## Instructions from the user", instructions.strip(), ""]
    if existing:
        parts.append("## Tasks already written (do not repeat them or rephrase them)")
        parts += [f"- {s.task}" for s in existing[-50:]]
        parts.append("")
    parts.append(
        f"Write {count} new, distinct tasks. Answer with a JSON object "
        '{"scenarios": [{"task": "...", "difficulty": 1-5}, ...]} '
        f"holding exactly {count} items."
    )
    return "\n".join(parts)


async def generate_scenarios(
    server: ServerLike,
    num_scenarios: int = 24,
    *,
    generator_model: str = "gpt-4.1",
    generator_base_url: str | None = None,
    generator_api_key: str | None = None,
    instructions: str | None = None,
    batch_size: int = 25,
    max_attempts: int = 3,
    temperature: float = 1.0,
    structured_output: bool = True,
    request_timeout: float = 300.0,
) -> list[Scenario]:
    """Ask ``generator_model`` for ``num_scenarios`` distinct tasks ``server``'s tools can solve.

    Tasks come ``batch_size`` per request. A reply that is not valid JSON of the expected shape
    (see ``SCENARIOS_SCHEMA``) is retried; after ``max_attempts`` bad replies in a row a
    ``ScenarioGenerationError`` names the problem. Duplicates (same normalized text) are
    dropped; if the generator keeps repeating itself, fewer scenarios than asked are returned
    (a warning is logged) rather than none. ``structured_output=False`` omits
    ``response_format`` for servers that do not support it. The key falls back to
    ``OPENAI_API_KEY``; a local server (base URL given) gets a placeholder.

    Example:
        >>> scenarios = await art_mcp.generate_scenarios(
        ...     "mcp-server-time", 20, generator_model="gpt-4.1")  # needs a network service: a hosted generator model  # doctest: +SKIP
        >>> art_mcp.save_scenarios(scenarios, "time_scenarios.jsonl")  # needs a network service: the scenarios above  # doctest: +SKIP
    """
    from openai import AsyncOpenAI, OpenAIError

    if num_scenarios < 1:
        raise ValueError(f"num_scenarios must be >= 1, got {num_scenarios}")
    if batch_size < 1 or max_attempts < 1:
        raise ValueError("batch_size and max_attempts must be >= 1")
    spec = parse_server(server)
    async with connect(spec) as session:
        tools, resources = session.tools, await session.list_resources()
    if not tools:
        raise ScenarioGenerationError(f"MCP server {spec.label!r} has no tools to write tasks for")
    catalog = describe_tools(tools, resources)
    api_key = _generator_api_key(generator_api_key, generator_base_url)
    client = AsyncOpenAI(base_url=generator_base_url, api_key=api_key, timeout=request_timeout)

    scenarios: list[Scenario] = []
    failures = 0
    fruitless = 0  # requests that added nothing new
    while len(scenarios) < num_scenarios:
        count = min(batch_size, num_scenarios - len(scenarios))
        params = _request_params(
            generator_model,
            _request_prompt(catalog, count, instructions, scenarios),
            temperature=temperature,
            structured_output=structured_output,
        )
        try:
            response = await client.chat.completions.create(**params)
            batch = parse_reply(response.choices[0].message.content if response.choices else None)
        except (ScenarioGenerationError, OpenAIError) as exc:
            failures += 1
            logger.warning("scenario generator attempt %d failed: %s", failures, exc)
            if failures >= max_attempts:
                raise ScenarioGenerationError(
                    f"no usable reply from the generator {generator_model!r} after "
                    f"{failures} attempts; last problem: {exc}"
                ) from exc
            continue
        failures = 0
        before = len(scenarios)
        scenarios = _with_new(scenarios, batch, num_scenarios)
        fruitless = fruitless + 1 if len(scenarios) == before else 0
        if fruitless >= max_attempts:
            logger.warning(
                "the generator repeated itself %d times: returning %d of %d scenarios",
                fruitless,
                len(scenarios),
                num_scenarios,
            )
            break
    return scenarios


def _with_new(scenarios: list[Scenario], batch: list[Scenario], limit: int) -> list[Scenario]:
    """``scenarios`` then the tasks of ``batch`` not among them (duplicates dropped), at
    most ``limit``."""
    known = {normalize_task(s.task) for s in scenarios}
    merged = dedupe([*scenarios, *(s for s in batch if normalize_task(s.task) not in known)])
    return merged[:limit]


def _generator_api_key(api_key: str | None, base_url: str | None) -> str:
    """The generator's key: given, else ``OPENAI_API_KEY``, else a placeholder for a local
    server; ValueError when there is none."""
    import os

    key = api_key or os.environ.get("OPENAI_API_KEY")
    if key is None and base_url is not None:
        key = "EMPTY"  # local OpenAI-compatible servers check no key
    if key is None:
        raise ValueError(
            "no API key for the generator: pass generator_api_key or set OPENAI_API_KEY"
        )
    return key


def _request_params(
    model: str, prompt: str, *, temperature: float, structured_output: bool
) -> dict[str, Any]:
    """One generator request: the system prompt, ``prompt``, and (with
    ``structured_output``) the reply's JSON schema."""
    params: dict[str, Any] = {
        "model": model,
        "messages": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": prompt},
        ],
        "temperature": temperature,
    }
    if structured_output:
        params["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "scenarios", "schema": RESPONSE_SCHEMA, "strict": True},
        }
    return params
