"""What a teacher says about a student's sequence: the data every teacher returns.

On-policy distillation scores the student's own sampled tokens with a teacher. A teacher
(``distill.local.LocalTeacher``: a model in this process; ``distill.endpoint.EndpointTeacher``:
any OpenAI-compatible server returning prompt logprobs) reads a ``TokenSequence`` and gives,
for each trained (sampled) token, in the order the tokens appear:

- ``token_logprobs[i]``: the teacher's logprob of that token given everything before it;
- ``top_ids[i]`` / ``top_logprobs[i]``: the teacher's ``top_k`` most likely tokens at that
  position and their logprobs, most likely first (empty lists when ``top_k`` is 0).

Teacher and student must share one tokenizer: the ids are the student's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from art_core.engines.base import MAX_PROMPT_LOGPROBS

if TYPE_CHECKING:
    from art_core.training.sequences import TokenSequence

# The most top logprobs a teacher may be asked for: what a prompt_logprobs request may ask.
MAX_TOP_K = MAX_PROMPT_LOGPROBS


@dataclass(frozen=True)
class TeacherScores:
    """A teacher's logprobs at the trained tokens of one sequence (see the module doc).

    Example:
        >>> scores = TeacherScores([-0.1], [[7, 3]], [[-0.1, -2.5]])
        >>> scores.check(num_trained=1, top_k=2)
    """

    token_logprobs: list[float]
    top_ids: list[list[int]]
    top_logprobs: list[list[float]]

    def check(self, *, num_trained: int, top_k: int, vocab_size: int | None = None) -> None:
        """Raise ``ValueError`` naming what is wrong unless this answers ``num_trained``
        tokens with ``top_k`` alternatives each, every logprob finite and <= 0 and every id
        inside the vocabulary."""
        if len(self.token_logprobs) != num_trained:
            raise ValueError(
                f"the teacher scored {len(self.token_logprobs)} tokens, the sequence trains "
                f"{num_trained}"
            )
        if len(self.top_ids) != num_trained or len(self.top_logprobs) != num_trained:
            raise ValueError(
                f"the teacher gave {len(self.top_ids)} top-id and {len(self.top_logprobs)} "
                f"top-logprob lists for {num_trained} tokens"
            )
        values = list(self.token_logprobs)
        for position, (ids, logprobs) in enumerate(
            zip(self.top_ids, self.top_logprobs, strict=True)
        ):
            if len(ids) != top_k or len(logprobs) != top_k:
                raise ValueError(
                    f"token {position}: the teacher gave {len(ids)} top ids and "
                    f"{len(logprobs)} logprobs, {top_k} were asked for"
                )
            if len(set(ids)) != len(ids):
                raise ValueError(f"token {position}: the teacher's top ids repeat: {ids}")
            bad_id = next(
                (i for i in ids if i < 0 or (vocab_size is not None and i >= vocab_size)), None
            )
            if bad_id is not None:
                raise ValueError(
                    f"token {position}: top id {bad_id} is outside the vocabulary "
                    f"(size {vocab_size}); do teacher and student share a tokenizer?"
                )
            values += logprobs
        bad = next((v for v in values if not math.isfinite(v) or v > 1e-4), None)
        if bad is not None:
            raise ValueError(f"teacher logprobs must be finite and <= 0, got {bad!r}")


class Teacher(Protocol):
    """Anything that scores sequences (synchronous: the trainer calls it from its worker
    thread, before the step's first forward)."""

    def score(self, sequences: Sequence[TokenSequence], top_k: int) -> list[TeacherScores]:
        """One ``TeacherScores`` per sequence, in order."""
        ...

    def close(self) -> None:
        """Free what the teacher holds (a model, connections)."""
        ...


def trained_positions(sequence: TokenSequence) -> list[int]:
    """The indices of a sequence's trained tokens (each scored from the ids before it).

    Example:
        >>> from art_core.training.sequences import TokenSequence
        >>> trained_positions(TokenSequence([1, 2, 3, 4], [False, True, False, True],
        ...                                 [0.0, -1.0, 0.0, -1.0]))
        [1, 3]
    """
    return [index for index, trained in enumerate(sequence.loss_mask) if trained]
