"""What the coordinator and the rank processes say to each other: JSON, never pickle.

A step's examples travel as plain JSON (token ids, loss mask, sampler logprobs, advantage,
weight, source, metric weight and teacher scores): Python writes floats with ``repr``, so they come back bit-identical and a
rank packs exactly the micro-batches the in-process trainer would. Each message is one JSON
object in one frame of the transport (a pipe's ``send_bytes`` locally, a Ray actor call).

Messages to a rank: ``{"op": "start" | "train" | "save" | "close", "payload": {...}}``.
Messages from a rank: ``{"kind": "event", "event": {...}}`` (progress),
``{"kind": "result", "result": {...}}`` (the op finished) or
``{"kind": "error", "type": ..., "message": ..., "traceback": ...}`` (the op raised).
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from art_core.distill.scores import TeacherScores
from art_core.training.packing import TrainingExample
from art_core.training.sequences import TokenSequence


def encode_examples(examples: Sequence[TrainingExample]) -> list[dict[str, Any]]:
    """JSON-ready records of examples (``decode_examples`` reverses it exactly).

    Example:
        >>> seq = TokenSequence([1, 2], [False, True], [0.0, -0.25])
        >>> decode_examples(encode_examples([TrainingExample(seq, 0.5, 0.125)]))[0].weight
        0.125
        >>> decode_examples(encode_examples([TrainingExample(seq, 0.5, 0.125, (3, 1))]))[0].source
        (3, 1)
    """
    return [
        {
            "token_ids": example.sequence.token_ids,
            "loss_mask": [1 if trained else 0 for trained in example.sequence.loss_mask],
            "logprobs": example.sequence.logprobs,
            "advantage": example.advantage,
            "weight": example.weight,
            "source": None if example.source is None else list(example.source),
            "metric_weight": example.metric_weight,
            "teacher": None if example.teacher is None else asdict(example.teacher),
        }
        for example in examples
    ]


def decode_examples(records: Sequence[dict[str, Any]]) -> list[TrainingExample]:
    """Examples from ``encode_examples`` records."""
    return [
        TrainingExample(
            TokenSequence(
                [int(token) for token in record["token_ids"]],
                [bool(trained) for trained in record["loss_mask"]],
                [float(logprob) for logprob in record["logprobs"]],
            ),
            float(record["advantage"]),
            float(record["weight"]),
            source=_source(record.get("source")),
            metric_weight=_optional_float(record.get("metric_weight")),
            teacher=_teacher(record.get("teacher")),
        )
        for record in records
    ]


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _teacher(value: Any) -> TeacherScores | None:
    if value is None:
        return None
    return TeacherScores(
        [float(lp) for lp in value["token_logprobs"]],
        [[int(i) for i in ids] for ids in value["top_ids"]],
        [[float(lp) for lp in lps] for lps in value["top_logprobs"]],
    )


def _source(value: Any) -> tuple[int, int] | None:
    return None if value is None else (int(value[0]), int(value[1]))


def dumps(message: dict[str, Any]) -> bytes:
    """One message as UTF-8 JSON (NaN/inf allowed: a diverged step reports them)."""
    return json.dumps(message, separators=(",", ":")).encode("utf-8")


def loads(data: bytes | str) -> dict[str, Any]:
    """One message from ``dumps``; anything but a JSON object is an error."""
    message = json.loads(data)
    if not isinstance(message, dict):
        raise ValueError(f"expected a JSON object, got {type(message).__name__}")
    return message


def error_message(error: BaseException) -> dict[str, Any]:
    """The ``error`` message of an op that raised ``error``."""
    return {
        "kind": "error",
        "type": type(error).__name__,
        "message": str(error),
        "traceback": "".join(traceback.format_exception(error)),
    }
