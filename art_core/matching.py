"""Match ART-style hand-built trajectories (``messages_and_choices``) to recorded calls.

A user who calls the gateway's plain ``/v1`` endpoint and builds the trajectory by hand keeps
the ``Choice`` objects the client returned. Each of our choices carries the recorded call's id
(``call_id``) and token ids (``token_ids``) as extension fields, which the openai client keeps;
with those the trainer gets the exact ids the model sampled.
"""

from __future__ import annotations

from typing import Any

from art_core.gateway.store import CallStore
from art_core.messages import is_choice
from art_core.trajectories import LLMCall, Trajectory


def _find(choice: dict[str, Any], store: CallStore) -> LLMCall | None:
    call_id = choice.get("call_id")
    if isinstance(call_id, str):
        found = store.get(call_id)
        if found is not None:
            return found
    token_ids = choice.get("token_ids")
    message = choice.get("message") or {}
    for call in reversed(store.recent_unscoped()):
        if token_ids is not None and call.completion_token_ids == token_ids:
            return call
        if (
            token_ids is None
            and call.response_message.get("content") == message.get("content")
            and (call.response_message.get("tool_calls") or None)
            == (message.get("tool_calls") or None)
        ):
            return call
    return None


def attach_recorded_calls(trajectory: Trajectory, store: CallStore) -> Trajectory:
    """The trajectory with ``calls`` filled from its choices (unchanged if it has calls).

    The choices of ``additional_histories`` count too: each history's calls become their own
    training sequences (they share no prefix with the main conversation).
    Raises ``ValueError`` naming the choice that matches no recorded call.

    Example:
        >>> attach_recorded_calls(Trajectory(messages_and_choices=[...]), store)  # fragment: a model's call `store`  # doctest: +SKIP
    """
    histories = [("messages_and_choices", trajectory.messages_and_choices)] + [
        (f"additional_histories[{i}].messages_and_choices", history.messages_and_choices)
        for i, history in enumerate(trajectory.additional_histories)
    ]
    if trajectory.calls or not any(items for _, items in histories):
        return trajectory
    calls: list[LLMCall] = []
    for where, items in histories:
        for position, item in enumerate(items):
            if not is_choice(item):
                continue
            call = _find(item, store)
            if call is None:
                raise ValueError(
                    f"trajectory {trajectory.id}: the choice at {where}[{position}] "
                    "matches no call recorded by this model's gateway (was it served by it?)"
                )
            if all(call.id != seen.id for seen in calls):
                calls.append(call)
    return trajectory.model_copy(update={"calls": calls})
