"""The run page's curves, computed from ``history.jsonl`` records.

One owner for what each curve means. Most are a recorded metric as it is; three are derived,
with the formula next to them:

- exception rate = ``train/num_exceptions / (train/num_trajectories + train/num_exceptions)``
- all-equal groups = ``train/groups_skipped / train/num_groups`` (groups GRPO learned nothing
  from: every rollout got the same reward)
- seconds per step: the period between two consecutive train records (``time``), split into
  training (``train/seconds``) and the rest (sampling, scoring, waiting); rollouts per second =
  ``train/num_trajectories`` over that rest.

A step recorded twice (a call that trained nothing, then one that trained) shows its last
record.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from art_core.ui.folder import finite_number

Record = dict[str, Any]
Value = Callable[[Record, Record | None], float | None]


def _number(record: Record, key: str) -> float | None:
    return finite_number(record.get(key))


def metric(key: str) -> Value:
    """A recorded metric as it is."""
    return lambda record, _previous: _number(record, key)


def _ratio(numerator: str, *denominators: str) -> Value:
    def value(record: Record, _previous: Record | None) -> float | None:
        top = _number(record, numerator)
        parts = [_number(record, key) for key in denominators]
        if top is None or any(part is None for part in parts):
            return None
        bottom = sum(part for part in parts if part is not None)
        return top / bottom if bottom > 0 else None

    return value


def _period(record: Record, previous: Record | None) -> float | None:
    if previous is None:
        return None
    now, before = _number(record, "time"), _number(previous, "time")
    if now is None or before is None or now <= before:
        return None
    return now - before


def _sampling_seconds(record: Record, previous: Record | None) -> float | None:
    period, training = _period(record, previous), _number(record, "train/seconds") or 0.0
    return None if period is None else max(period - training, 0.0)


def _rollouts_per_second(record: Record, previous: Record | None) -> float | None:
    seconds, rollouts = (
        _sampling_seconds(record, previous),
        _number(record, "train/num_trajectories"),
    )
    if not seconds or rollouts is None:
        return None
    return rollouts / seconds


@dataclass(frozen=True)
class Series:
    """One line of a curve: its label, the split whose records it reads, how to read a value,
    and optionally the metric whose value is drawn as a band (mean +- it)."""

    label: str
    split: str
    value: Value
    band: str | None = None


@dataclass(frozen=True)
class Curve:
    id: str
    title: str
    series: tuple[Series, ...]


CURVES: tuple[Curve, ...] = (
    Curve(
        "reward",
        "Reward (band: spread across rollouts)",
        (
            Series("train", "train", metric("train/reward"), band="train/reward_std"),
            Series("validation", "val", metric("val/reward")),
        ),
    ),
    Curve(
        "exceptions",
        "Exception rate",
        (
            Series(
                "train",
                "train",
                _ratio("train/num_exceptions", "train/num_trajectories", "train/num_exceptions"),
            ),
        ),
    ),
    Curve(
        "all_equal",
        "Groups with all-equal rewards (nothing learned)",
        (Series("train", "train", _ratio("train/groups_skipped", "train/num_groups")),),
    ),
    Curve(
        "loss",
        "Loss",
        (
            Series("loss", "train", metric("train/loss")),
            Series("policy loss", "train", metric("train/policy_loss")),
        ),
    ),
    Curve("kl", "KL to the base model", (Series("kl", "train", metric("train/kl")),)),
    Curve("entropy", "Entropy", (Series("entropy", "train", metric("train/entropy")),)),
    Curve("grad_norm", "Grad norm", (Series("grad norm", "train", metric("train/grad_norm")),)),
    Curve(
        "seconds",
        "Seconds per step",
        (
            Series("sampling and the rest", "train", _sampling_seconds),
            Series("training", "train", metric("train/seconds")),
        ),
    ),
    Curve(
        "rollouts_per_second",
        "Rollouts per second (sampling)",
        (Series("rollouts/s", "train", _rollouts_per_second),),
    ),
    Curve(
        "policy_age",
        "Policy age of trained groups (pipelined)",
        (
            Series("mean", "train", metric("train/pipeline_policy_age_mean")),
            Series("max", "train", metric("train/pipeline_policy_age_max")),
        ),
    ),
    Curve(
        "stale",
        "Stale groups dropped (pipelined)",
        (Series("dropped", "train", metric("train/pipeline_dropped_stale")),),
    ),
)


def last_per_step(records: list[Record], split: str) -> list[Record]:
    """The records of ``split``, one per step (the last), in step order."""
    by_step: dict[int, Record] = {}
    for record in records:
        if record.get("split", "train") == split:
            by_step[record["step"]] = record
    return [by_step[step] for step in sorted(by_step)]


def curve_points(curve: Curve, records: list[Record]) -> list[dict[str, Any]]:
    """Each series of ``curve`` as ``{"label", "points": [[step, value, band], ...]}``;
    series without a point are left out.

    Example:
        >>> records = [{"step": 0, "split": "train", "train/reward": 0.5, "train/reward_std": 0.1}]
        >>> curve_points(CURVES[0], records)
        [{'label': 'train', 'points': [[0, 0.5, 0.1]]}]
    """
    drawn = []
    splits = {series.split: last_per_step(records, series.split) for series in curve.series}
    for series in curve.series:
        points = []
        previous = None
        for record in splits[series.split]:
            value = series.value(record, previous)
            previous = record
            if value is None:
                continue
            band = _number(record, series.band) if series.band else None
            points.append([record["step"], value, band])
        if points:
            drawn.append({"label": series.label, "points": points})
    return drawn


def run_curves(records: list[Record]) -> list[dict[str, Any]]:
    """Every curve with at least one point: ``{"id", "title", "series"}``."""
    curves = []
    for curve in CURVES:
        series = curve_points(curve, records)
        if series:
            curves.append({"id": curve.id, "title": curve.title, "series": series})
    return curves


def recorded_metrics(records: list[Record]) -> list[str]:
    """Every numeric metric name recorded (for plotting any one of them)."""
    names = {
        key
        for record in records
        for key, value in record.items()
        if "/" in key and isinstance(value, int | float) and not isinstance(value, bool)
    }
    return sorted(names)


def metric_curve(name: str, records: list[Record]) -> dict[str, Any] | None:
    """A curve of one recorded metric (any split), or None when it has no point."""
    split = name.split("/", 1)[0]
    curve = Curve(name, name, (Series(name, split, metric(name)),))
    series = curve_points(curve, records)
    return {"id": name, "title": name, "series": series} if series else None


def curve_csv(curve: dict[str, Any]) -> str:
    """A curve as CSV: ``step`` then one column per series (and ``{label} band``).

    Example:
        >>> print(curve_csv({"series": [{"label": "train", "points": [[0, 0.5, None]]}]}), end="")
        step,train
        0,0.5
    """
    series = curve["series"]
    banded = [any(p[2] is not None for p in s["points"]) for s in series]
    header = ["step"]
    for s, has_band in zip(series, banded, strict=True):
        header += [s["label"]] + ([f"{s['label']} band"] if has_band else [])
    rows: dict[int, list[Any]] = {}
    width = len(header) - 1
    column = 0
    for s, has_band in zip(series, banded, strict=True):
        for step, value, band in s["points"]:
            row = rows.setdefault(step, [""] * width)
            row[column] = value
            if has_band:
                row[column + 1] = "" if band is None else band
        column += 2 if has_band else 1
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    for step in sorted(rows):
        writer.writerow([step, *rows[step]])
    return out.getvalue()
