"""Chat prompts as token ids, spliced onto the ids of earlier calls of the same rollout.

Re-tokenizing a conversation's text does not always give back the ids the model sampled (a
model may emit a non-canonical tokenization, and templates re-serialize tool calls). When a
request continues an earlier call of its rollout (its messages are that call's messages plus
the answer it returned, plus new turns), the prompt is built as
``earlier prompt ids + sampled ids + ids of the new turns``. The model then sees exactly what
it produced, and the trainer can merge the calls into one token-exact sequence.
"""

from __future__ import annotations

import functools
import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import orjson

from art_core.chat_formats import ChatFormat, chat_format_for
from art_core.trajectories import LLMCall


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))


def normalize_message(message: dict[str, Any]) -> dict[str, Any]:
    """A message with text content and only the fields a chat template reads.

    Example:
        >>> normalize_message({"role": "user", "content": [{"type": "text", "text": "hi"}], "refusal": None})
        {'role': 'user', 'content': 'hi'}
    """
    normalized: dict[str, Any] = {"role": message["role"], "content": _text(message.get("content"))}
    if message.get("name"):
        normalized["name"] = message["name"]
    if message.get("tool_call_id"):
        normalized["tool_call_id"] = message["tool_call_id"]
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if message["role"] == "assistant" and isinstance(reasoning, str) and reasoning:
        # Templates of thinking models render it (Qwen3: after the last user turn).
        normalized["reasoning_content"] = reasoning
    if message.get("tool_calls"):
        normalized["tool_calls"] = [
            {
                "id": call.get("id", ""),
                "type": "function",
                "function": {
                    "name": call["function"]["name"],
                    "arguments": call["function"].get("arguments") or "{}",
                },
            }
            for call in message["tool_calls"]
        ]
    return normalized


def with_argument_objects(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` with its tool calls' JSON-string arguments as objects, as vLLM hands them
    to templates: the real templates (Qwen2.5, Llama 3.1, gpt-oss, Mistral) write
    ``arguments | tojson``, which would quote a string a second time (Qwen3-Coder's raises)."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    converted = []
    for call in calls:
        try:
            arguments = json.loads(call["function"]["arguments"])
        except (json.JSONDecodeError, TypeError):
            arguments = None
        if isinstance(arguments, dict):
            call = {**call, "function": {**call["function"], "arguments": arguments}}
        converted.append(call)
    return {**message, "tool_calls": converted}


def _same_answer(sent: dict[str, Any], returned: dict[str, Any]) -> bool:
    """Whether the client sent back the assistant message we returned (ids may differ)."""

    def calls(message: dict[str, Any]) -> list[tuple[str, Any]]:
        out = []
        for call in message.get("tool_calls") or []:
            try:
                arguments = json.loads(call["function"]["arguments"] or "{}")
            except (json.JSONDecodeError, TypeError):
                arguments = call["function"]["arguments"]
            out.append((call["function"]["name"], arguments))
        return out

    return (
        sent.get("role") == "assistant"
        and _text(sent.get("content")).strip() == _text(returned.get("content")).strip()
        and calls(sent) == calls(returned)
    )


class PromptBuilder:
    """Renders chat requests with the tokenizer's template and encodes them to ids.

    A rollout's next call renders its previous call's messages again (to find where the
    sampled ids go): renders are remembered by content (``render_cache_chars`` of text at
    most), so each conversation state is rendered once. Text is encoded by the fast tokenizer's
    backend directly (the ids ``tokenizer(text)`` gives, without its per-call overhead, and
    without holding the GIL, so a long prompt on a worker thread does not stall the loop).

    Example:
        >>> from transformers import AutoTokenizer
        >>> from art_core.embedded import resolve_base_model
        >>> tokenizer = AutoTokenizer.from_pretrained(resolve_base_model("tiny-random"))
        >>> builder = PromptBuilder(tokenizer, eos_token_ids={2})
        >>> ids = builder.build([{"role": "user", "content": "hi"}], tools=None, history=[])
        >>> print(tokenizer.decode(ids))
        <|im_start|>system
        You are a helpful assistant.<|im_end|>
        <|im_start|>user
        hi<|im_end|>
        <|im_start|>assistant
        <BLANKLINE>
    """

    def __init__(
        self,
        tokenizer: Any,
        eos_token_ids: set[int],
        *,
        chat_format: ChatFormat | None = None,
        render_cache_chars: int = 32 * 1024 * 1024,
    ) -> None:
        self.tokenizer = tokenizer
        # Where an assistant turn ends in a rendered history is the format's to say.
        self.chat_format = chat_format or chat_format_for(tokenizer)
        # Rendered prompts by content, newest last, at most render_cache_chars in all (a text
        # over a sixteenth of it is not kept).
        self._rendered: OrderedDict[bytes, str] = OrderedDict()
        self._rendered_chars = 0
        self._render_cache_chars = render_cache_chars
        self._lock = threading.Lock()
        self.eos_token_ids = eos_token_ids
        self._eos_texts = sorted(
            {tokenizer.decode([i], skip_special_tokens=False) for i in eos_token_ids} - {""},
            key=len,
            reverse=True,
        )
        self.max_token_chars  # noqa: B018 - computed once here, not on a request's path

    @functools.cached_property
    def max_token_chars(self) -> int:
        """The most characters one token stands for (its longest vocabulary entry): a text of
        more than ``n * max_token_chars`` characters has more than ``n`` tokens."""
        vocab = self.tokenizer.get_vocab()
        return max((len(token) for token in vocab), default=1)

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The prompt text of ``messages`` (normalized) with ``tools`` (and the request's
        ``chat_template_kwargs``, e.g. Qwen3's ``enable_thinking``), from the cache when this
        conversation state was rendered before."""
        key = hashlib.blake2b(
            orjson.dumps([messages, tools or None, template_kwargs or None]), digest_size=16
        ).digest()
        with self._lock:
            text = self._rendered.get(key)
            if text is not None:
                self._rendered.move_to_end(key)
                return text
        text = str(
            self.tokenizer.apply_chat_template(
                [with_argument_objects(m) for m in messages],
                tools=tools or None,
                add_generation_prompt=True,
                tokenize=False,
                **(template_kwargs or {}),
            )
        )
        if len(text) > self._render_cache_chars // 16:
            return text
        with self._lock:
            if key not in self._rendered:
                self._rendered[key] = text
                self._rendered_chars += len(text)
            while self._rendered_chars > self._render_cache_chars:
                self._rendered_chars -= len(self._rendered.popitem(last=False)[1])
        return text

    def encode(self, text: str) -> list[int]:
        """``text``'s ids, as ``tokenizer(text, add_special_tokens=False)`` gives them."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None and backend.truncation is None and backend.padding is None:
            return list(backend.encode_batch([text], add_special_tokens=False)[0].ids)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def build(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        history: Sequence[LLMCall] = (),
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """Prompt ids for ``messages`` (normalized), reusing the ids of a call it continues."""
        full = self.render(messages, tools, template_kwargs)
        for previous in sorted(history, key=lambda c: len(c.messages), reverse=True):
            if not previous.messages:
                continue  # a completions call (a raw prompt): no conversation to continue
            spliced = self._splice(messages, tools, full, previous, template_kwargs)
            if spliced is not None:
                return spliced
        return self.encode(full)

    def _splice(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        full: str,
        previous: LLMCall,
        template_kwargs: dict[str, Any] | None,
    ) -> list[int] | None:
        k = len(previous.messages)
        if len(messages) <= k or (previous.tools or None) != (tools or None):
            return None
        if messages[:k] != previous.messages or not _same_answer(
            messages[k], previous.response_message
        ):
            return None
        if (previous.request_params.get("chat_template_kwargs") or None) != (
            template_kwargs or None
        ):
            return None
        before = self.render(previous.messages, tools, template_kwargs)
        if not full.startswith(before):
            return None  # the template rewrote history; fall back to plain encoding
        # Where the answer's turn ends in the re-rendered text, and with which end token.
        found = self.chat_format.turn_end(full, len(before), self._eos_texts)
        if found is None:
            return None
        end, turn_end = found
        sampled = previous.completion_token_ids
        if sampled and sampled[-1] in self.eos_token_ids:
            # The model closed its turn itself (with whichever end token it chose).
            tail = full[end + len(turn_end) :]
        else:  # cut by max_tokens or a stop string: the template closes the turn for it
            tail = full[end:]
        return [*previous.prompt_token_ids, *sampled, *self.encode(tail)]
