"""ART's message types, and the list that keeps ``messages_and_choices`` plain JSON.

ART rollouts build a trajectory by hand and append the ``Choice`` objects the openai client
returns: ``trajectory.messages_and_choices.append(choice)``. ``MessageList`` converts every
item as it enters, however the list is changed (``append``, ``extend``, ``insert``, ``+=``,
item and slice assignment; ``Trajectory`` converts whole-list assignment), so a trajectory
always holds JSON dicts. A choice keeps the ``call_id`` / ``token_ids`` the gateway put on it
and is matched to its recorded call for training, whichever way it got into the list.

The type aliases are ART's (``art.Messages``, ``art.MessagesAndChoices``, ``art.Tools``): the
openai types for a type checker, plain dicts at runtime (importing openai's types costs 0.4 s).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, SupportsIndex, TypeAlias

from pydantic import BaseModel

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam
    from openai.types.chat.chat_completion import Choice

    Message: TypeAlias = ChatCompletionMessageParam
    MessageOrChoice: TypeAlias = ChatCompletionMessageParam | Choice | dict[str, Any]
    Messages: TypeAlias = list[ChatCompletionMessageParam]
    MessagesAndChoices: TypeAlias = list[MessageOrChoice]
    Tools: TypeAlias = list[ChatCompletionToolParam]
else:
    Message = dict[str, Any]
    MessageOrChoice = dict[str, Any]
    Messages = list[dict[str, Any]]
    MessagesAndChoices = list[Any]
    Tools = list[dict[str, Any]]


def _has_model(value: Any) -> bool:
    if isinstance(value, BaseModel):
        return True
    if isinstance(value, dict):
        return any(_has_model(item) for item in value.values())
    if isinstance(value, list | tuple):
        return any(_has_model(item) for item in value)
    return False


def _plain(value: Any) -> Any:
    """JSON data for ``value``: pydantic models (openai's objects) dumped, containers walked."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_none=True)
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def plain_message(item: Any) -> dict[str, Any]:
    """One ``messages_and_choices`` item as a JSON dict: a message, or a choice.

    Accepts message dicts, choice dicts, and openai / pydantic objects (a ``Choice``, a
    ``ChatCompletionMessage``). Raises ``TypeError`` naming what was given otherwise, with a
    hint for the common slip of appending the whole ``ChatCompletion``.

    Example:
        >>> plain_message({"role": "user", "content": "hi"})
        {'role': 'user', 'content': 'hi'}
    """
    if isinstance(item, BaseModel):
        if getattr(item, "object", None) == "chat.completion" or (
            hasattr(item, "choices") and not hasattr(item, "message")
        ):
            raise TypeError(
                "messages_and_choices takes a message or a choice, got a "
                f"{type(item).__name__}: append `completion.choices[0]`, not the completion"
            )
        plain = _plain(item)
    elif isinstance(item, dict):
        # A plain dict is kept as the caller's object (ART code may edit it after appending).
        plain = _plain(item) if _has_model(item) else item
    else:
        raise TypeError(
            "a message or choice must be a dict or an openai / pydantic object, "
            f"got {type(item).__name__}"
        )
    if not all(isinstance(key, str) for key in plain):
        raise TypeError("a message or choice must have string keys")
    return plain


def is_choice(item: dict[str, Any]) -> bool:
    """Whether a plain ``messages_and_choices`` item is a choice (trained on) or a message.

    Example:
        >>> is_choice({"index": 0, "message": {"role": "assistant"}, "finish_reason": "stop"})
        True
    """
    return "message" in item and "finish_reason" in item


def message_of(item: dict[str, Any]) -> dict[str, Any]:
    """The chat message of an item: a choice's ``message``, or the item itself.

    Example:
        >>> message_of({"message": {"role": "assistant", "content": "4"}, "finish_reason": "stop"})
        {'role': 'assistant', 'content': '4'}
    """
    if is_choice(item):
        message = item["message"]
        return dict(message) if isinstance(message, dict) else plain_message(message)
    return item


class MessageList(list[dict[str, Any]]):
    """A list whose items are converted to plain JSON dicts as they enter it.

    Example:
        >>> items = MessageList([{"role": "system", "content": "Be brief."}])
        >>> items.append({"index": 0, "message": {"role": "assistant", "content": "ok"},
        ...               "finish_reason": "stop"})
        >>> items += [{"role": "user", "content": "thanks"}]
        >>> [is_choice(item) for item in items]
        [False, True, False]
    """

    def __init__(self, items: Iterable[Any] = ()) -> None:
        super().__init__([plain_message(item) for item in items])

    def append(self, item: Any) -> None:
        super().append(plain_message(item))

    def extend(self, items: Iterable[Any]) -> None:
        # Convert everything first: a bad item leaves the list as it was.
        super().extend([plain_message(item) for item in items])

    def insert(self, index: SupportsIndex, item: Any) -> None:
        super().insert(index, plain_message(item))

    def __setitem__(self, index: Any, value: Any) -> None:
        if isinstance(index, slice):
            super().__setitem__(index, [plain_message(item) for item in value])
        else:
            super().__setitem__(index, plain_message(value))

    def __iadd__(self, items: Iterable[Any]) -> MessageList:  # type: ignore[override,misc]
        self.extend(items)
        return self

    def copy(self) -> MessageList:
        return MessageList(self)
