"""Checks that a recorded rollout is token-exact: what tests of any integration assert.

Token-exact means the ids trained on are the ids sampled: each call's sampled ids decode to
the recorded text with one logprob per id, and (for one agent talking turn after turn) each
call's prompt starts with the previous call's prompt and sampled ids.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from art_core.trajectories import LLMCall, Trajectory


def assert_prefix_chain(calls: Sequence[LLMCall]) -> None:
    """Each call's prompt ids start with the previous call's prompt + sampled ids.

    Example:
        >>> assert_prefix_chain(trajectory.calls)  # fragment: a `trajectory` recorded by the gateway  # doctest: +SKIP
    """
    for before, after in itertools.pairwise(calls):
        prefix = before.prompt_token_ids + before.completion_token_ids
        assert after.prompt_token_ids[: len(prefix)] == prefix


def assert_token_exact(
    trajectory: Trajectory, tokenizer: Any, *, prefix_chain: bool = True
) -> None:
    """Every call belongs to ``trajectory``'s rollout, its sampled ids decode to its text, with
    one logprob per sampled id (and at least one id); with ``prefix_chain`` (one agent's
    consecutive turns) the prompts chain too (:func:`assert_prefix_chain`).

    Example:
        >>> assert_token_exact(run.trajectory(), backend.engine(model).tokenizer)  # fragment: a captured `run` of a registered `model`  # doctest: +SKIP
    """
    for call in trajectory.calls:
        assert call.rollout_id == trajectory.id
        decoded = tokenizer.decode(call.completion_token_ids, skip_special_tokens=False)
        assert decoded == call.completion_text
        assert len(call.logprobs) == len(call.completion_token_ids) > 0
    if prefix_chain:
        assert_prefix_chain(trajectory.calls)


def tool_call_in_text(tool_call: dict[str, Any], text: str) -> bool:
    """Whether ``text``, a completion in the Hermes / Qwen markup (``<tool_call>{json}
    </tool_call>``), holds this tool call (name and arguments, compared as JSON values): the
    call a loop executed is the one the model wrote.

    Example:
        >>> call = {"function": {"name": "add", "arguments": '{"a": 1}'}}
        >>> tool_call_in_text(call, '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')
        True
    """
    for body in re.findall(r"<tool_call>(.*?)</tool_call>", text, flags=re.DOTALL):
        written = json.loads(body)
        function = tool_call["function"]
        if written.get("name") == function["name"] and written.get("arguments") == json.loads(
            function["arguments"]
        ):
            return True
    return False
