"""``art-core ruler``: score trajectory groups from a JSONL file with RULER and print a table.

Each non-blank line of the input is a ``TrajectoryGroup`` JSON object or a JSON list of
trajectories. Exit codes: 0 all groups scored, 1 a group could not be scored (the others
still are), 2 unusable input or options.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from pydantic import ValidationError

from art_core.rewards.prompt import DEFAULT_MAX_TOOL_RESULT_CHARS, DEFAULT_RUBRIC
from art_core.rewards.ruler import DEFAULT_TIMEOUT_S, ruler_score_group
from art_core.trajectories import Trajectory, TrajectoryGroup

_EXPLANATION_WIDTH = 70


class InputError(ValueError):
    """The input file or an option cannot be used (exit code 2)."""


def add_parser(subparsers: Any) -> None:
    """Register the ``ruler`` subcommand on the ``art-core`` parser.

    Example:
        >>> parser = argparse.ArgumentParser()
        >>> add_parser(parser.add_subparsers())
        >>> parser.parse_args(["ruler", "g.jsonl", "--judge-model", "m"]).judge_model
        'm'
    """
    parser = subparsers.add_parser(
        "ruler",
        help="score trajectory groups from a JSONL file with an LLM judge (RULER)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("file", type=Path, help="JSONL: one TrajectoryGroup (or list) per line")
    parser.add_argument("--judge-model", required=True, help="model name sent to the judge")
    parser.add_argument(
        "--judge-base-url", default=None, help="OpenAI-compatible base URL (default: $OPENAI_BASE_URL)"
    )
    parser.add_argument(
        "--judge-api-key", default=None, help="API key (default: $OPENAI_API_KEY)"
    )
    parser.add_argument("--rubric", type=Path, default=None, help="text file replacing the rubric")
    parser.add_argument("--out", type=Path, default=None, help="write the scored groups as JSONL")
    parser.add_argument("--no-cache", action="store_true", help="always ask the judge")
    parser.add_argument("--cache-path", type=Path, default=None, help="SQLite cache file")
    parser.add_argument(
        "--max-tool-result-chars",
        type=int,
        default=DEFAULT_MAX_TOOL_RESULT_CHARS,
        help="cap on each tool result shown to the judge (0 = none)",
    )
    parser.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per judge request"
    )
    parser.add_argument("--concurrency", type=int, default=4, help="groups judged at once")
    parser.set_defaults(func=run)


def read_groups(path: Path) -> list[TrajectoryGroup]:
    """Load the groups of a JSONL file; raise InputError naming the bad line.

    Example:
        >>> read_groups(Path("groups.jsonl"))  # doctest: +SKIP
        [TrajectoryGroup(...), ...]
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc}") from exc
    groups: list[TrajectoryGroup] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            if isinstance(data, list):
                group = TrajectoryGroup([Trajectory.model_validate(item) for item in data])
            elif isinstance(data, dict) and "trajectories" in data:
                group = TrajectoryGroup.model_validate(data)
            else:
                raise InputError("expected a TrajectoryGroup object or a list of trajectories")
        except (ValueError, ValidationError) as exc:
            raise InputError(f"{path}:{number}: {exc}") from exc
        groups.append(group)
    if not groups:
        raise InputError(f"{path} holds no trajectory groups")
    return groups


def _shorten(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def print_table(
    results: Sequence[tuple[TrajectoryGroup, dict[str, float], str | None]], out: TextIO
) -> None:
    """Print one row per run (previous reward, RULER score, explanation) and a line per group."""
    header = f"{'group':>5}  {'run':>3}  {'trajectory':<18}  {'before':>7}  {'ruler':>6}  explanation"
    out.write(header + "\n" + "-" * len(header) + "\n")
    for number, (group, before, error) in enumerate(results, start=1):
        if error is not None:
            out.write(f"{number:>5}  FAILED: {error}\n")
            continue
        for run, trajectory in enumerate(group.trajectories, start=1):
            explanation = trajectory.logs[-1].split(": ", 1)[-1] if trajectory.logs else ""
            out.write(
                f"{number:>5}  {run:>3}  {_shorten(trajectory.id, 18):<18}  "
                f"{before[trajectory.id]:>7.3f}  {trajectory.reward:>6.3f}  "
                f"{_shorten(explanation, _EXPLANATION_WIDTH)}\n"
            )
        m = group.metrics
        source = "cache" if m["ruler_cache_hit"] else f"{m['ruler_judge_latency_s']:.2f} s"
        out.write(
            f"{'':>5}  group {number}: {m['ruler_judge_calls']} judge call(s), "
            f"{m['ruler_prompt_tokens']} prompt tokens, {m['ruler_unique_runs']} distinct runs, "
            f"{source}\n"
        )


async def _score_all(
    groups: list[TrajectoryGroup], args: argparse.Namespace, rubric: str
) -> list[tuple[TrajectoryGroup, dict[str, float], str | None]]:
    limit = asyncio.Semaphore(max(1, args.concurrency))

    async def score(group: TrajectoryGroup) -> tuple[TrajectoryGroup, dict[str, float], str | None]:
        before = {t.id: t.reward for t in group.trajectories}
        async with limit:
            try:
                await ruler_score_group(
                    group,
                    args.judge_model,
                    judge_base_url=args.judge_base_url,
                    judge_api_key=args.judge_api_key,
                    rubric=rubric,
                    max_tool_result_chars=args.max_tool_result_chars,
                    request_timeout=args.timeout,
                    cache=not args.no_cache,
                    cache_path=args.cache_path,
                )
            except ValueError:
                raise  # bad options: the same for every group
            except Exception as exc:
                return group, before, str(exc)
        return group, before, None

    return await asyncio.gather(*(score(group) for group in groups))


def _write_jsonl(path: Path, groups: Sequence[TrajectoryGroup]) -> None:
    # Write next to the target and rename, so a crash never leaves half a file behind.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        for group in groups:
            handle.write(group.model_dump_json() + "\n")
    tmp.replace(path)


def run(args: argparse.Namespace) -> int:
    """Run ``art-core ruler``; return the exit code (0 ok, 1 a group failed, 2 bad input)."""
    try:
        rubric = DEFAULT_RUBRIC
        if args.rubric is not None:
            try:
                rubric = args.rubric.read_text(encoding="utf-8")
            except OSError as exc:
                raise InputError(f"cannot read rubric {args.rubric}: {exc}") from exc
        groups = read_groups(args.file)
        results = asyncio.run(_score_all(groups, args, rubric))
    except (InputError, ValueError) as exc:
        print(f"art-core ruler: error: {exc}", file=sys.stderr)
        return 2
    print_table(results, sys.stdout)
    failed = [number for number, (_, _, error) in enumerate(results, start=1) if error]
    scored = [group for group, _, error in results if error is None]
    calls = sum(int(group.metrics["ruler_judge_calls"]) for group in scored)
    tokens = sum(int(group.metrics["ruler_prompt_tokens"]) for group in scored)
    print(
        f"scored {len(scored)}/{len(results)} groups with {calls} judge call(s), "
        f"{tokens} prompt tokens"
    )
    if args.out is not None:
        _write_jsonl(args.out, scored)
        print(f"wrote {len(scored)} scored groups to {args.out}")
    if failed:
        print(
            f"art-core ruler: {len(failed)} group(s) could not be scored: "
            + ", ".join(map(str, failed)),
            file=sys.stderr,
        )
        return 1
    return 0
