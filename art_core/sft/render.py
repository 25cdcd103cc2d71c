"""Demonstrations as the trainer's token sequences: token-exact when recorded, else rendered.

- A trajectory whose calls this model's gateway recorded (found by call id in its record:
  ``run.trajectory()``, or ART-style choices carrying the gateway's ``call_id``) trains on
  the ids the model ran and sampled, assembled exactly as GRPO assembles them
  (``training.sequences.assemble_sequences``): sampled tokens trained, the rest context.
- Anything else (chat records, a teacher's runs, trajectories recorded for another model)
  is rendered with this model's chat template, tools and tool calls included, the way the
  gateway renders requests: each assistant turn's tokens are what follows its generation
  prompt, up to and including the end-of-turn token; the prompts of later turns are spliced
  onto the ids of the earlier ones, as the gateway splices a rollout's calls. The rendered
  turns then go through the same assembly, so a multi-turn record is one sequence.

Example:
    >>> renderer = SFTRenderer(load_chat_tokenizer(base_path))  # fragment: a model's `base_path`, and `chat.jsonl`  # doctest: +SKIP
    >>> record = renderer.record(demonstrations("chat.jsonl")[0])  # fragment  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from art_core.engines.tokenizer import ChatTokenizer
from art_core.gateway.prompts import PromptBuilder, with_argument_objects
from art_core.sft.data import AssistantTurns, ChatTurn, Demonstration, chat_turns
from art_core.training.sequences import TokenSequence, assemble_sequences
from art_core.training.sft import SFTRecord
from art_core.trajectories import LLMCall, Trajectory

# Looks a call up by id in the model's call record (``CallStore.get``).
RecordedLookup = Callable[[str], LLMCall | None]


def recorded_calls(trajectory: Trajectory, lookup: RecordedLookup | None) -> list[LLMCall] | None:
    """The trajectory's calls as this model's gateway recorded them; None unless all are.

    Example:
        >>> recorded_calls(Trajectory(), lambda call_id: None) is None
        True
    """
    if lookup is None:
        return None
    if trajectory.calls:
        ids: list[Any] = [call.id for call in trajectory.calls]
    else:
        ids = [choice.get("call_id") for choice in trajectory.choices()]
    if not ids or not all(isinstance(call_id, str) for call_id in ids):
        return None
    found = [lookup(call_id) for call_id in ids]
    if any(call is None or not call.prompt_token_ids for call in found):
        return None
    return [call for call in found if call is not None]


def token_sequences(calls: list[LLMCall], trained: set[str]) -> list[TokenSequence]:
    """GRPO's assembly of ``calls``; completions of calls not in ``trained`` become context.

    Sequences left with no trained token are dropped, and each ends at its last trained token.

    Example:
        >>> a = LLMCall(model="m", messages=[], prompt_token_ids=[1], completion_token_ids=[2],
        ...             logprobs=[0.0])
        >>> b = LLMCall(model="m", messages=[], index=1, prompt_token_ids=[1, 2, 3],
        ...             completion_token_ids=[4], logprobs=[0.0])
        >>> [s.loss_mask for s in token_sequences([a, b], trained={b.id})]
        [[False, False, False, True]]
    """
    by_id = {call.id: call for call in calls}
    sequences = []
    for sequence in assemble_sequences(calls).sequences:
        for call_id in sequence.call_ids:
            if call_id not in trained:
                call = by_id[call_id]
                # The call's completion follows its prompt: the sequence was a prefix of it.
                start = len(call.prompt_token_ids)
                end = start + len(call.completion_token_ids)
                sequence.loss_mask[start:end] = [False] * (end - start)
        if sequence.num_trainable_tokens:
            # Context after the last trained token cannot change any trained prediction.
            end = len(sequence) - sequence.loss_mask[::-1].index(True)
            del sequence.token_ids[end:], sequence.loss_mask[end:], sequence.logprobs[end:]
            sequences.append(sequence)
    return sequences


class SFTRenderer:
    """Turns demonstrations into ``SFTRecord``s for one model's tokenizer and template.

    Example:
        >>> renderer = SFTRenderer(chat)  # fragment: a model's `chat` tokenizer, `demos`, its call `store`  # doctest: +SKIP
        >>> records = renderer.records(demos, assistant_turns="all", lookup=store.get)  # fragment  # doctest: +SKIP
    """

    def __init__(self, chat: ChatTokenizer) -> None:
        self.chat = chat
        self.prompts = PromptBuilder(chat.tokenizer, chat.eos_token_ids, chat_format=chat.format)
        self._end_texts = sorted(
            {chat.tokenizer.decode([i], skip_special_tokens=False) for i in chat.eos_token_ids}
            - {""},
            key=len,
            reverse=True,
        )
        self.token_exact = 0
        self.rendered = 0

    def records(
        self,
        demos: Iterable[Demonstration],
        *,
        assistant_turns: AssistantTurns = "all",
        lookup: RecordedLookup | None = None,
    ) -> list[SFTRecord]:
        """Every demonstration as a record; ``ValueError`` naming the first that cannot be."""
        return [self.record(demo, assistant_turns=assistant_turns, lookup=lookup) for demo in demos]

    def record(
        self,
        demo: Demonstration,
        *,
        assistant_turns: AssistantTurns = "all",
        lookup: RecordedLookup | None = None,
    ) -> SFTRecord:
        """One demonstration as token sequences (see the module); checked against the
        model's context."""
        calls = recorded_calls(demo.trajectory, lookup)
        if calls is not None:
            # Checked like any record (a sampled call of a tool that does not exist is not
            # something to imitate), then trained on the ids the model sampled.
            chat_turns(Demonstration(demo.label, Trajectory(calls=calls)), recorded=True)
            last = max(calls, key=lambda call: (call.index, call.choice_index))
            trained = {last.id} if assistant_turns == "last" else {call.id for call in calls}
            self.token_exact += 1
        else:
            calls, trained = self._render(demo.label, chat_turns(demo, assistant_turns))
            self.rendered += 1
        sequences = token_sequences(calls, trained)
        if not sequences:
            raise ValueError(f"{demo.label}: no assistant token to train on")
        longest = max(len(sequence) for sequence in sequences)
        if longest > self.chat.context_length:
            raise ValueError(
                f"{demo.label}: {longest} tokens, over the model's context of "
                f"{self.chat.context_length} tokens"
            )
        return SFTRecord(demo.label, sequences)

    # ------------------------------------------------------------------------------ rendering
    def _full_text(self, turn: ChatTurn) -> str:
        text = self.chat.tokenizer.apply_chat_template(
            [with_argument_objects(m) for m in [*turn.messages, turn.answer]],
            tools=turn.tools or None,
            add_generation_prompt=False,
            tokenize=False,
        )
        return str(text)

    def _turn_end(self, answer_text: str) -> str:
        """The answer up to and including its end-of-turn token (what the model emits)."""
        ends = [(i, end) for end in self._end_texts if (i := answer_text.find(end)) >= 0]
        if not ends:
            return answer_text
        index, end = min(ends, key=lambda found: found[0])
        return answer_text[: index + len(end)]

    def _render(self, label: str, turns: list[ChatTurn]) -> tuple[list[LLMCall], set[str]]:
        """One pseudo-call per assistant turn, with this model's token ids."""
        calls: list[LLMCall] = []
        texts: list[tuple[str, list[dict[str, Any]] | None]] = []  # (prompt + answer, tools)
        for index, turn in enumerate(turns):
            try:
                prompt_text = self.prompts.render(turn.messages, turn.tools)
                full_text = self._full_text(turn)
            except Exception as exc:  # a template that cannot render these messages
                raise ValueError(
                    f"{label}: the chat template cannot render assistant turn {index}: {exc}"
                ) from None
            if not full_text.startswith(prompt_text):
                raise ValueError(
                    f"{label}: the chat template renders assistant turn {index} so that its "
                    "text does not follow the generation prompt; its tokens cannot be told apart"
                )
            answer_text = self._turn_end(full_text[len(prompt_text) :])
            prompt_ids: list[int] | None = None
            for earlier, (head, tools) in zip(reversed(calls), reversed(texts), strict=True):
                if tools == turn.tools and prompt_text.startswith(head):
                    # As the gateway splices a rollout's calls: the earlier ids, then the rest.
                    tail = self.prompts.encode(prompt_text[len(head) :])
                    prompt_ids = [*earlier.prompt_token_ids, *earlier.completion_token_ids, *tail]
                    break
            if prompt_ids is None:
                prompt_ids = self.prompts.encode(prompt_text)
            answer_ids = self.prompts.encode(answer_text)
            if not answer_ids or not prompt_ids:
                raise ValueError(f"{label}: assistant turn {index} renders to no token")
            calls.append(
                LLMCall(
                    model="sft",
                    messages=turn.messages,
                    tools=turn.tools,
                    index=index,
                    prompt_token_ids=prompt_ids,
                    completion_token_ids=answer_ids,
                    logprobs=[0.0] * len(answer_ids),
                    response_message=turn.answer,
                )
            )
            texts.append((prompt_text + answer_text, turn.tools))
        trained = {call.id for call, turn in zip(calls, turns, strict=True) if turn.trained}
        return calls, trained
