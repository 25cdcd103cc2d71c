"""Token-exact training sequences from a rollout's recorded LLM calls.

The trainer never re-tokenizes text: it trains on the ids the engine ran and sampled. A
multi-turn rollout makes several calls whose prompts grow: call 2's prompt is call 1's prompt,
call 1's completion, then the tool results or user turn. Such calls merge into one sequence
(one forward pass instead of one per call), where only the sampled completion tokens are
trained on (mask 1, carrying the sampler's logprobs) and everything else is context (mask 0).

When a call's prompt does not extend any earlier sequence (a chat template that rewrites
history, or an independent branch of the agent), it starts a new sequence and is counted as a
break, so a metric shows how much merging was lost.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from art_core.trajectories import LLMCall


@dataclass
class TokenSequence:
    """One training sequence: token ids, which of them are trained, and sampler logprobs.

    ``logprobs[i]`` is the sampler's logprob of ``token_ids[i]`` where ``loss_mask[i]`` is
    true, and 0.0 where it is context.

    Example:
        >>> seq = TokenSequence([1, 2, 3], [False, False, True], [0.0, 0.0, -0.5])
        >>> seq.num_trainable_tokens
        1
    """

    token_ids: list[int]
    loss_mask: list[bool]
    logprobs: list[float]
    call_ids: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not (len(self.token_ids) == len(self.loss_mask) == len(self.logprobs)):
            raise ValueError(
                "token_ids, loss_mask and logprobs must have the same length, got "
                f"{len(self.token_ids)}, {len(self.loss_mask)}, {len(self.logprobs)}"
            )
        if self.loss_mask and self.loss_mask[0]:
            # A token is trained through the logits of the position before it.
            raise ValueError("the first token of a sequence cannot be trained (it has no prefix)")

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_trainable_tokens(self) -> int:
        return sum(self.loss_mask)

    def _extend(self, call: LLMCall) -> None:
        context = call.prompt_token_ids[len(self.token_ids) :]
        self.token_ids += context + call.completion_token_ids
        self.loss_mask += [False] * len(context) + [True] * len(call.completion_token_ids)
        self.logprobs += [0.0] * len(context) + list(call.logprobs)
        self.call_ids.append(call.id)


@dataclass
class AssembledSequences:
    """The sequences of one rollout and how many calls could not be merged."""

    sequences: list[TokenSequence]
    breaks: int

    @property
    def num_trainable_tokens(self) -> int:
        return sum(seq.num_trainable_tokens for seq in self.sequences)


def _validate_call(call: LLMCall) -> None:
    if len(call.logprobs) != len(call.completion_token_ids):
        raise ValueError(
            f"call {call.id}: {len(call.completion_token_ids)} completion tokens but "
            f"{len(call.logprobs)} logprobs; the trainer needs one sampler logprob per token"
        )
    if not call.prompt_token_ids:
        raise ValueError(f"call {call.id}: empty prompt_token_ids; cannot train on it")
    # A tiny positive value is float rounding of log(1); anything larger is a corrupt record.
    bad = [lp for lp in call.logprobs if not math.isfinite(lp) or lp > 1e-4]
    if bad:
        raise ValueError(
            f"call {call.id}: logprobs must be finite and <= 0, got {bad[0]!r} "
            "(was a token sampled that a grammar mask had ruled out?)"
        )


def _is_prefix(prefix: list[int], ids: list[int]) -> bool:
    return len(prefix) <= len(ids) and ids[: len(prefix)] == prefix


def assemble_sequences(calls: Iterable[LLMCall]) -> AssembledSequences:
    """Merge a rollout's calls into as few token-exact training sequences as possible.

    Calls are taken in recorded order (``index``, then ``choice_index``). Each call extends
    the longest earlier sequence whose ids are a prefix of its prompt (not only the last one,
    so interleaved parallel branches each keep their own sequence); otherwise it starts a new
    sequence, counted as a break unless it is a sibling choice (``n > 1``) of one request.

    Example:
        >>> c1 = LLMCall(model="m", messages=[], prompt_token_ids=[1, 2],
        ...              completion_token_ids=[3, 4], logprobs=[-0.1, -0.2])
        >>> c2 = LLMCall(model="m", messages=[], index=1, prompt_token_ids=[1, 2, 3, 4, 9],
        ...              completion_token_ids=[5], logprobs=[-0.3])
        >>> out = assemble_sequences([c1, c2])
        >>> out.sequences[0].token_ids, out.sequences[0].loss_mask, out.breaks
        ([1, 2, 3, 4, 9, 5], [False, False, True, True, False, True], 0)
    """
    ordered = sorted(calls, key=lambda call: (call.index, call.choice_index))
    sequences: list[TokenSequence] = []
    breaks = 0
    for call in ordered:
        _validate_call(call)
        candidates = [seq for seq in sequences if _is_prefix(seq.token_ids, call.prompt_token_ids)]
        if candidates:
            max(candidates, key=len)._extend(call)
            continue
        if sequences and call.choice_index == 0:
            breaks += 1
        sequence = TokenSequence([], [], [])
        sequence._extend(call)
        sequences.append(sequence)
    return AssembledSequences(sequences=sequences, breaks=breaks)
