"""LangChain's own standard test suites (``langchain-tests``: ``ChatModelUnitTests`` and
``ChatModelIntegrationTests``) against ``art_langgraph.init_chat_model`` on the gateway.

The model is a stand-in: tiny-random fine-tuned to answer in the three shapes a chat model is
asked for (a short sentence, a short JSON object, a short tool call; see ``PROMPTS``). Plain
tiny-random answers noise whose greedy choice flips with how the engine batched a request: an
empty answer (end of turn first), or JSON strings that never end within the suite's
``max_tokens=100``, which the suite's checks rightly refuse. The stand-in knows the formats,
not the tasks, so the tests that need a model that reads the request (``magic_function(3)``
-> ``{"input": 3}``; decide by itself to call a tool; write the keys a prompt asks for in JSON
mode) are marked ``xfail(strict=True)`` with that reason; plain ``ChatOpenAI`` on the same
model fails them too.

The suites' tests are used as they are (the suite fails a subclass that overrides one other
than to mark it ``xfail``). Optional features the gateway has are switched on (JSON mode, model
override, Anthropic-style inputs, the streaming timing test, which runs live). The suites skip
six tests themselves: the five for image / audio / PDF inputs (a text-only model; they also
download their files), which ``TestTextOnlyInputs`` replaces with what the gateway does (a 400
naming the part), and ``test_serdes``: ``langchain_core.load`` only revives classes on
LangChain's own allowlist, which a subclass outside LangChain cannot be on.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import inspect
import random
from collections.abc import Callable
from typing import Any, ClassVar

import openai
import pytest
from art_langgraph import init_chat_model
from art_langgraph.chat_model import ArtChatModel
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_tests.integration_tests import ChatModelIntegrationTests
from langchain_tests.unit_tests import ChatModelUnitTests

import art_core as art
from art_core.testing.fine_tuned import fine_tuned_stand_in

UNUSED_URL = "http://127.0.0.1:9/v1"  # unit tests never send a request
NEEDS_CAPABLE_MODEL = "needs a model that reads the request (the stand-in only knows formats)"
TEXT_ONLY = "only text content parts"
TINY_PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6360000000000200015e2b6f3f0000000049454e44ae426082"
    )
).decode()


def needs_capable_model(why: str, *, strict: bool = True) -> Callable[[Any], Any]:
    """The suite's test, unchanged, marked as one only a capable model passes (``strict``:
    the stand-in always fails it; not strict: it passes or fails by the stand-in's luck)."""

    def mark(test: Any) -> Any:
        if inspect.iscoroutinefunction(test):

            @functools.wraps(test)
            async def wrapper(*args: Any, **kwargs: Any) -> Any:
                return await test(*args, **kwargs)
        else:

            @functools.wraps(test)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                return test(*args, **kwargs)

        xfail = pytest.mark.xfail(reason=f"{NEEDS_CAPABLE_MODEL}: {why}", strict=strict)
        wrapper.pytestmark = [*getattr(test, "pytestmark", []), xfail]  # type: ignore[attr-defined]
        return wrapper

    return mark


@pytest.fixture(scope="session")
def vcr_config(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """VCR lets requests to the gateway through (a local server: nothing to record or replay)
    and writes no cassettes into the repository."""
    return {
        "record_mode": "none",
        "ignore_localhost": True,
        "cassette_library_dir": str(tmp_path_factory.mktemp("vcr")),
    }


# What the suite asks a chat model, and short answers in the three shapes it expects (a
# sentence, a JSON object, a tool call): tiny-random fine-tuned on them. Its own answers can be
# empty (an end-of-turn first) or strings that never end within max_tokens, which the suite's
# checks rightly refuse; a capable chat model writes short answers in these shapes.
PROMPTS = [
    "hello",
    "hi",
    "Hello, how are you?",
    "What is the weather in San Francisco, CA?",
    "Tell me a joke about cats.",
    "What is 1 + 2?",
    "Summarize this document:",
    "Write a story about a cat.",
    "What's your name?",
    "Use the tool.",
    "Give a concise description of this image.",
    "Describe it.",
]
ANSWER = "Hello! I am a small test model."
JSON_ANSWERS = [
    '{"setup": "Why was the cat sad?", "punchline": "It lost its mouse."}',
    '{"setup": "Why?", "punchline": "Because.", "rating": 7}',
    '{"answer": "Paris", "justification": "It is the capital."}',
]


def chat_conversations(count: int = 96, seed: int = 0) -> list[list[dict[str, Any]]]:
    """Random histories (roles repeated, turns of any content, a tool round trip) ending in a
    prompt and ANSWER; only that last answer is trained (``"weight": 0`` on the others)."""
    rng = random.Random(seed)
    words = ["hello", "how are you", "hi", "ok", "Paris", "3", "What is 1 + 2", "thanks"]
    out: list[list[dict[str, Any]]] = []
    for i in range(count):
        history: list[dict[str, Any]] = []
        for _ in range(rng.randrange(4)):
            role = rng.choice(["system", "user", "assistant"])
            message: dict[str, Any] = {"role": role, "content": rng.choice(words)}
            history.append({**message, "weight": 0} if role == "assistant" else message)
        if rng.random() < 0.25:
            call = {
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": "my_adder_tool", "arguments": '{"a": 1, "b": 2}'},
            }
            history += [
                {"role": "user", "content": rng.choice(PROMPTS)},
                {"role": "assistant", "content": None, "tool_calls": [call], "weight": 0},
                {"role": "tool", "tool_call_id": f"call_{i}", "content": "3"},
            ]
        else:
            history.append({"role": "user", "content": rng.choice(PROMPTS)})
        shape = rng.random()
        if shape < 0.5:
            answer: dict[str, Any] = {"role": "assistant", "content": ANSWER}
        elif shape < 0.75:  # a short JSON answer (structured output)
            answer = {"role": "assistant", "content": rng.choice(JSON_ANSWERS)}
        else:  # a short tool call
            arguments = rng.choice(['{"a": 1, "b": 2}', '{"input": 3}', "{}", '{"x": "a"}'])
            call = {
                "id": f"c{i}",
                "type": "function",
                "function": {"name": "f", "arguments": arguments},
            }
            answer = {"role": "assistant", "content": None, "tool_calls": [call]}
        out.append([*history, answer])
    return out


@pytest.fixture(scope="session")
async def standard_model(backend: art.LocalBackend) -> art.TrainableModel:
    """A model (and engine) of its own, that answers in a sentence: tiny-random fine-tuned."""
    folder = await asyncio.to_thread(
        fine_tuned_stand_in, "stand-in-chat", chat_conversations(), steps=300, learning_rate=1e-2
    )
    model = art.TrainableModel(name="lg-standard", project="langgraph", base_model=str(folder))
    await model.register(backend)
    return model


class TestUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[BaseChatModel]:
        return ArtChatModel

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"model": "lg-tiny", "base_url": UNUSED_URL, "api_key": "art"}

    @property
    def init_from_env_params(self) -> tuple[dict[str, str], dict[str, Any], dict[str, Any]]:
        return (
            {"OPENAI_API_KEY": "art-key", "OPENAI_API_BASE": UNUSED_URL},
            {"model": "lg-tiny"},
            {"openai_api_key": "art-key", "openai_api_base": UNUSED_URL},
        )


class TestIntegration(ChatModelIntegrationTests):
    gateway: ClassVar[dict[str, Any]] = {}

    @pytest.fixture(autouse=True)
    def _gateway(self, standard_model: art.TrainableModel) -> None:
        # The suite reads chat_model_params (a property) outside fixtures as well.
        type(self).gateway = {
            "art_model": standard_model,
            "model": standard_model.get_inference_name(),
            "base_url": standard_model.inference_base_url,
            "api_key": standard_model.inference_api_key or "art",
        }

    @property
    def chat_model_class(self) -> type[BaseChatModel]:
        return ArtChatModel

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return dict(self.gateway)

    @pytest.fixture
    def model(self, request: Any, standard_model: art.TrainableModel) -> BaseChatModel:
        extra = getattr(request, "param", None) or {}
        return init_chat_model(standard_model, **{**self.standard_chat_model_params, **extra})

    # ------------------------------------------------------------------ features switched on
    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def model_override_value(self) -> str:
        return "lg-standard@0"  # the base model, as an adapter step the gateway serves

    @property
    def supports_anthropic_inputs(self) -> bool:
        return True

    @property
    def enable_vcr_tests(self) -> bool:
        # test_stream_time: with nothing recorded (see vcr_config) it streams live
        return True

    # ------------------------------------------------------------ only a capable model passes
    test_tool_calling = needs_capable_model("the arguments must be {'input': 3}, one call")(
        ChatModelIntegrationTests.test_tool_calling
    )
    test_tool_calling_async = needs_capable_model("the arguments must be {'input': 3}")(
        ChatModelIntegrationTests.test_tool_calling_async
    )
    test_tool_calling_with_no_arguments = needs_capable_model(
        "the tool's schema allows any properties; the arguments must be {}"
    )(ChatModelIntegrationTests.test_tool_calling_with_no_arguments)
    test_agent_loop = needs_capable_model("the model must decide to call the tool (auto)")(
        ChatModelIntegrationTests.test_agent_loop
    )
    test_unicode_tool_call_integration = needs_capable_model(
        "the arguments must copy the customer's Chinese name"
    )(ChatModelIntegrationTests.test_unicode_tool_call_integration)
    test_json_mode = needs_capable_model("the JSON object must have the keys the prompt asks for")(
        ChatModelIntegrationTests.test_json_mode
    )
    # Seen failing 1 run in ~10 on a fresh clone: the forced call's arguments follow the
    # schema's shape, but the value of answer_style is whatever the stand-in writes (empty in
    # some batches), so it passes or fails by luck: not strict.
    test_bind_runnables_as_tools = needs_capable_model(
        "the argument answer_style must say a style (a pirate's)", strict=False
    )(ChatModelIntegrationTests.test_bind_runnables_as_tools)
    # Seen passing in 2 of 4 whole runs (2026-12-07): the grammar of a pydantic.v1 schema allows
    # extra keys, and the stand-in writes one of its trained JSON answers, with the two keys
    # asked or with a third, by how the engine batched the request: not strict.
    test_structured_output_pydantic_2_v1 = needs_capable_model(
        "a pydantic.v1 schema allows extra keys (no strict json_schema): only the keys asked",
        strict=False,
    )(ChatModelIntegrationTests.test_structured_output_pydantic_2_v1)


class TestTextOnlyInputs:
    """The suite skips its image / audio / PDF tests for a model that declares no support
    (and they download their files); what the gateway does with such parts is checked here:
    a 400 naming what it takes, in user and tool messages alike."""

    @pytest.fixture
    def model(self, standard_model: art.TrainableModel) -> BaseChatModel:
        return init_chat_model(standard_model, temperature=0, max_tokens=8)

    @pytest.mark.parametrize(
        "part",
        [
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{TINY_PNG}"}},
            {"type": "input_audio", "input_audio": {"data": TINY_PNG, "format": "wav"}},
            {
                "type": "file",
                "file": {
                    "filename": "a.pdf",
                    "file_data": f"data:application/pdf;base64,{TINY_PNG}",
                },
            },
        ],
        ids=["image", "audio", "pdf"],
    )
    def test_a_part_it_cannot_read_is_a_clear_400(
        self, model: BaseChatModel, part: dict[str, Any]
    ) -> None:
        with pytest.raises(openai.BadRequestError, match=TEXT_ONLY):
            model.invoke([HumanMessage(content=[{"type": "text", "text": "Describe it."}, part])])
        calls = [{"type": "tool_call", "id": "1", "name": "random_file", "args": {}}]
        history = [
            HumanMessage("Get a random file using the tool."),
            AIMessage("", tool_calls=calls),
            ToolMessage(content=[part], tool_call_id="1", name="random_file"),
        ]

        def random_file() -> str:
            """Return a random file."""
            return ""

        with pytest.raises(openai.BadRequestError, match=TEXT_ONLY):
            model.bind_tools([random_file]).invoke(history)
        # the same chat model keeps working afterwards
        assert isinstance(model.invoke("hi"), AIMessage)
