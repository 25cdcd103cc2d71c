"""Validation of OpenAI chat-completion requests: anything wrong becomes a clear 4xx.

JSON Schemas (tool ``parameters``, ``response_format``) are bounded before they are checked
(``MAX_SCHEMA_BYTES``, ``MAX_SCHEMA_DEPTH``, ``MAX_SCHEMA_NODES``): checking costs ~0.5 ms per
subschema, so an unbounded one is a way to occupy the server. A schema that passed is
remembered by content in the ``SchemaChecks`` passed as pydantic's validation context
(``{"schema_checks": ...}``; the gateway keeps one): agents send the same tools with every call.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from typing import Annotated, Any, Literal

import jsonschema
import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_N = 16
MAX_TOOLS = 128  # OpenAI's limit
# Stop strings are matched against every sampled token's text (and held back while streaming
# until they cannot match): bounded so that costs microseconds, not milliseconds, per token.
MAX_STOP_CHARS = 256
# A seed is a signed 64-bit integer (OpenAI's and vLLM's range; torch seeds each choice with
# seed + its index, which stays within its unsigned 64-bit range).
MIN_SEED, MAX_SEED = -(2**63), 2**63 - 1
# Bounds of one JSON Schema: its compact JSON size, nesting of JSON objects/arrays, and number
# of objects/arrays in it (each a potential subschema).
MAX_SCHEMA_BYTES = 64 * 1024
MAX_SCHEMA_DEPTH = 32
MAX_SCHEMA_NODES = 2000
# A chat_template_kwargs value: a scalar or a short string (the template's own switches).
TEMPLATE_VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
# apply_chat_template's own arguments (tokenize=True would turn the prompt into a list).
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
        "kwargs",
    }
)
TemplateValue = bool | int | float | Annotated[str, Field(max_length=256)] | None


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    arguments: str = "{}"


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    # An assistant turn's reasoning, as vLLM returns it (both of its names).
    reasoning_content: str | None = None
    reasoning: str | None = None

    @model_validator(mode="after")
    def _check(self) -> Message:
        if isinstance(self.content, list):
            for part in self.content:
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ValueError(
                        "only text content parts ({'type': 'text', 'text': ...}) are supported"
                    )
        if self.role == "tool" and self.content is None:
            raise ValueError("a tool message needs `content`")
        if self.role not in ("assistant",) and self.content is None:
            raise ValueError(f"a {self.role} message needs `content`")
        if self.role == "assistant" and self.content is None and not self.tool_calls:
            raise ValueError("an assistant message needs `content` or `tool_calls`")
        return self


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not TOOL_NAME.match(value):
            raise ValueError("tool names are 1-64 letters, digits, '_' or '-'")
        return value

    @field_validator("parameters")
    @classmethod
    def _schema(cls, value: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
        if value is None:
            return value
        check_json_schema(value, _checks(info))
        if value.get("type", "object") != "object":
            raise ValueError("tool parameters must be a JSON Schema of type 'object'")
        return value


class Tool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: FunctionDef


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: dict[str, str]

    @field_validator("function")
    @classmethod
    def _name(cls, value: dict[str, str]) -> dict[str, str]:
        if "name" not in value:
            raise ValueError("a named tool_choice needs function.name")
        return value


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    name: str = "response"
    json_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"}, alias="schema")
    strict: bool | None = None

    @field_validator("json_schema")
    @classmethod
    def _schema(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        check_json_schema(value, _checks(info))
        return value


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _check(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format of type json_schema needs `json_schema`")
        return self


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


def check_stop(value: str | list[str] | None) -> str | list[str] | None:
    """``stop`` as a request gives it (a string or a list), checked: at most 4 non-empty
    strings of at most ``MAX_STOP_CHARS`` characters (the chat and completions routes).

    Example:
        >>> check_stop(["\\n\\n", "END"])
        ['\\n\\n', 'END']
    """
    stops = [value] if isinstance(value, str) else value or []
    if len(stops) > 4 or any(not s or len(s) > MAX_STOP_CHARS for s in stops):
        raise ValueError(
            f"stop takes up to 4 non-empty strings of at most {MAX_STOP_CHARS} characters"
        )
    return value


class ChatCompletionRequest(BaseModel):
    """The fields we serve; unknown extra fields (e.g. ``user``) are accepted and ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str
    messages: list[Message] = Field(min_length=1)
    tools: list[Tool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    n: int = Field(default=1, ge=1, le=MAX_N)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=MIN_SEED, le=MAX_SEED)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    stream: bool = False
    stream_options: StreamOptions | None = None
    metadata: dict[str, Any] | None = None
    # Extra variables for the chat template, as vLLM takes them (Qwen3's enable_thinking).
    chat_template_kwargs: dict[str, TemplateValue] | None = Field(default=None, max_length=16)

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        for key in value or {}:
            if not TEMPLATE_VARIABLE.match(key) or key in RESERVED_TEMPLATE_KWARGS:
                raise ValueError(
                    f"chat_template_kwargs cannot set {key!r}: keys are template variables "
                    "(letters, digits, '_'), not arguments of apply_chat_template"
                )
        return value

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        return check_stop(value)

    @model_validator(mode="after")
    def _check(self) -> ChatCompletionRequest:
        names = {tool.function.name for tool in self.tools or []}
        if isinstance(self.tool_choice, NamedToolChoice):
            name = self.tool_choice.function["name"]
            if name not in names:
                raise ValueError(f"tool_choice names {name!r}, which is not in `tools`")
        if self.tool_choice == "required" and not names:
            raise ValueError("tool_choice 'required' needs `tools`")
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    @property
    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


def schema_key(schema: dict[str, Any]) -> bytes:
    """The content key of ``schema`` (its canonical JSON's digest); ``ValueError`` when its JSON
    is over ``MAX_SCHEMA_BYTES``.

    Example:
        >>> schema_key({"b": 1, "a": 2}) == schema_key({"a": 2, "b": 1})
        True
    """
    try:
        text = orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)
    except (orjson.JSONEncodeError, TypeError) as exc:
        raise ValueError(f"the JSON Schema cannot be written as JSON: {exc}") from None
    if len(text) > MAX_SCHEMA_BYTES:
        raise ValueError(
            f"the JSON Schema is {len(text)} bytes as JSON; at most {MAX_SCHEMA_BYTES} are accepted"
        )
    return hashlib.blake2b(text, digest_size=16).digest()


class SchemaChecks:
    """Which schemas (by ``schema_key``) passed the check; the newest ``capacity`` are kept.

    Only a pure function's answers are kept (a schema's validity never changes), so one memo
    serves every request and thread of a gateway.

    Example:
        >>> checks = SchemaChecks(capacity=2)
        >>> checks.add(b"k"); b"k" in checks
        True
    """

    def __init__(self, capacity: int = 4096) -> None:
        self.capacity = capacity
        self._passed: OrderedDict[bytes, None] = OrderedDict()
        self._lock = threading.Lock()

    def __contains__(self, key: object) -> bool:
        with self._lock:
            if key not in self._passed:
                return False
            self._passed.move_to_end(key)  # type: ignore[arg-type]
            return True

    def add(self, key: bytes) -> None:
        with self._lock:
            self._passed[key] = None
            while len(self._passed) > self.capacity:
                self._passed.popitem(last=False)


def _checks(info: ValidationInfo) -> SchemaChecks | None:
    context = info.context
    return context.get("schema_checks") if isinstance(context, dict) else None


def check_schema_bounds(schema: dict[str, Any]) -> None:
    """``ValueError`` when ``schema`` nests deeper than ``MAX_SCHEMA_DEPTH`` or holds more than
    ``MAX_SCHEMA_NODES`` objects and arrays (cheap: one walk, before the real check)."""
    nodes = 0
    stack: list[tuple[Any, int]] = [(schema, 1)]
    while stack:
        item, depth = stack.pop()
        nodes += 1
        if nodes > MAX_SCHEMA_NODES:
            raise ValueError(
                f"the JSON Schema has more than {MAX_SCHEMA_NODES} objects and arrays; "
                "split or simplify it"
            )
        if depth > MAX_SCHEMA_DEPTH:
            raise ValueError(f"the JSON Schema nests deeper than {MAX_SCHEMA_DEPTH} levels")
        children = item.values() if isinstance(item, dict) else item
        stack += [(c, depth + 1) for c in children if isinstance(c, dict | list)]


def schema_is_checked(schema: Any, checks: SchemaChecks) -> bool:
    """Whether ``schema`` is known to pass ``check_json_schema`` (a cheap lookup)."""
    if not isinstance(schema, dict):
        return True  # pydantic refuses it without checking it
    try:
        return schema_key(schema) in checks
    except ValueError:
        return True  # refused by its size, without checking it


def check_json_schema(schema: dict[str, Any], checks: SchemaChecks | None = None) -> None:
    """Raise ``ValueError`` naming the problem when ``schema`` is over the bounds or not a
    valid JSON Schema; a schema that passed once (in ``checks``) passes at the cost of a
    lookup.

    Example:
        >>> check_json_schema({"type": 12})
        Traceback (most recent call last):
        ...
        ValueError: invalid JSON Schema at type: 12 is not valid under any of the given schemas
    """
    key = schema_key(schema)
    if checks is not None and key in checks:
        return
    check_schema_bounds(schema)
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        path = "/".join(str(p) for p in exc.path) or "(root)"
        raise ValueError(f"invalid JSON Schema at {path}: {exc.message}") from None
    except RecursionError:
        raise ValueError("the JSON Schema nests too deeply to check") from None
    if checks is not None:
        checks.add(key)
