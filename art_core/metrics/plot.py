"""``art-core plot MODEL_DIR``: reward, loss and judge-score curves from ``history.jsonl``.

Writes ``reward.png``, ``loss.png`` and (when RULER scored the rollouts) ``judge.png`` plus an
``index.html`` that shows them with a table of every step, into ``MODEL_DIR/plots`` (or
``--out``). Needs ``matplotlib`` (``pip install 'art-core[plot]'``).
"""

from __future__ import annotations

import argparse
import html
import math
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from art_core.files import atomic_write_text
from art_core.model_folder import ModelFolder

# (file stem, title, y label, history metrics drawn on it)
PANELS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    (
        "reward",
        "Reward",
        "mean reward",
        ("train/reward", "val/reward", "train/independent_reward", "val/independent_reward"),
    ),
    ("loss", "Loss", "loss", ("train/loss", "train/policy_loss", "train/kl")),
    ("judge", "Judge (RULER) score", "mean score", ("train/ruler_score", "val/ruler_score")),
)

Series = list[tuple[int, float]]


@dataclass
class PlotResult:
    """What ``plot_history`` wrote: the files, and the (step, value) points of every curve."""

    files: list[Path] = field(default_factory=list)
    series: dict[str, Series] = field(default_factory=dict)

    @property
    def html(self) -> Path | None:
        return next((f for f in self.files if f.suffix == ".html"), None)


def metric_series(records: Sequence[dict[str, Any]]) -> dict[str, Series]:
    """Every numeric metric as (step, mean value at that step) points, by step.

    Example:
        >>> metric_series([{"step": 0, "train/reward": 0.1}, {"step": 1, "train/reward": 0.5}])
        {'train/reward': [(0, 0.1), (1, 0.5)]}
    """
    values: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for record in records:
        step = record.get("step")
        if not isinstance(step, int):
            continue
        for name, value in record.items():
            if "/" in name and isinstance(value, int | float) and not isinstance(value, bool):
                if math.isfinite(value):
                    values[name][step].append(float(value))
    return {
        name: [(step, sum(v) / len(v)) for step, v in sorted(by_step.items())]
        for name, by_step in sorted(values.items())
    }


def _draw(path: Path, title: str, ylabel: str, curves: dict[str, Series]) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # The object API (no pyplot): no global figure state, safe in any thread.
    figure = Figure(figsize=(7, 4), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for name, points in curves.items():
        steps, ys = zip(*points, strict=True)
        axes.plot(steps, ys, marker="o" if len(points) < 30 else None, markersize=3, label=name)
    axes.set_title(title)
    axes.set_xlabel("step")
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3)
    axes.legend(loc="best", fontsize="small")
    figure.tight_layout()
    figure.savefig(path)


def _html(model_dir: Path, images: list[Path], series: dict[str, Series]) -> str:
    steps = sorted({step for points in series.values() for step, _ in points})
    names = list(series)
    lookup = {name: dict(points) for name, points in series.items()}
    head = "".join(f"<th>{html.escape(n)}</th>" for n in names)
    rows = "".join(
        "<tr><td>{}</td>{}</tr>".format(
            step,
            "".join(
                f"<td>{lookup[n][step]:.4g}</td>" if step in lookup[n] else "<td></td>"
                for n in names
            ),
        )
        for step in steps
    )
    figures = "".join(
        f'<img src="{html.escape(p.name)}" alt="{html.escape(p.stem)}">' for p in images
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(model_dir.name)}: training curves</title>"
        "<style>body{font-family:sans-serif;margin:2em}img{max-width:48%;margin:4px}"
        "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:2px 6px}"
        "</style></head><body>"
        f"<h1>{html.escape(model_dir.name)}</h1><p>{html.escape(str(model_dir))}</p>"
        f"{figures}<h2>History by step</h2><table><tr><th>step</th>{head}</tr>{rows}</table>"
        "</body></html>"
    )


def plot_history(model_dir: Path, out_dir: Path | None = None) -> PlotResult:
    """Draw the curves of ``model_dir/history.jsonl`` into ``out_dir`` (default: ``model_dir/plots``).

    Example:
        >>> result = plot_history(Path(".art/demo/models/agent-001"))  # needs files: a model folder with a history  # doctest: +SKIP
        >>> [f.name for f in result.files]                             # needs files  # doctest: +SKIP
        ['reward.png', 'loss.png', 'index.html']
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise ImportError("plots need matplotlib: pip install 'art-core[plot]'") from exc
    folder = ModelFolder(Path(model_dir))
    if not folder.history.is_file():
        raise FileNotFoundError(f"no history at {folder.history}")
    model_dir = folder.root
    series = metric_series(folder.read_history())
    if not series:
        raise ValueError(f"{folder.history} has no metrics to plot")
    out = Path(out_dir) if out_dir is not None else model_dir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    result = PlotResult(series=series)
    images = []
    for stem, title, ylabel, metrics in PANELS:
        curves = {name: series[name] for name in metrics if series.get(name)}
        if not curves:
            continue
        path = out / f"{stem}.png"
        _draw(path, title, ylabel, curves)
        images.append(path)
    page = out / "index.html"
    atomic_write_text(page, _html(model_dir, images, series))
    result.files = [*images, page]
    return result


def add_parser(subparsers: Any) -> None:
    """Register ``art-core plot`` on the CLI.

    Example:
        >>> parser = argparse.ArgumentParser()
        >>> add_parser(parser.add_subparsers())
        >>> parser.parse_args(["plot", "m"]).model_dir
        PosixPath('m')
    """
    parser = subparsers.add_parser(
        "plot",
        help="draw reward, loss and judge-score curves of a model folder (PNG + HTML)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "model_dir", type=Path, help="the model's folder (.art/PROJECT/models/NAME)"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="output folder (default: MODEL_DIR/plots)"
    )
    parser.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    try:
        result = plot_history(args.model_dir, args.out)
    except (FileNotFoundError, ValueError, ImportError) as exc:
        print(f"art-core plot: {exc}", file=sys.stderr)
        return 2
    for path in result.files:
        print(path)
    for name in ("train/reward", "val/reward"):
        points = result.series.get(name)
        if points:
            print(
                f"{name}: {points[0][1]:.3f} (step {points[0][0]}) -> {points[-1][1]:.3f} (step {points[-1][0]})"
            )
    return 0
