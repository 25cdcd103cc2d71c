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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from pydantic import ValidationError

from art_core.files import jsonl_lines
from art_core.rewards.options import DEFAULT_TIMEOUT_S, RulerOptions
from art_core.rewards.prompt import DEFAULT_MAX_TOOL_RESULT_CHARS, DEFAULT_RUBRIC
from art_core.rewards.ruler import Judgement, apply_judgement, judge_group
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
    parser.add_argument(
        "--judge-model",
        required=True,
        help="model name sent to the judge, or a LiteLLM id such as openai/o3",
    )
    parser.add_argument(
        "--judge-base-url",
        default=None,
        help="OpenAI-compatible base URL (default: $OPENAI_BASE_URL)",
    )
    parser.add_argument("--judge-api-key", default=None, help="API key (default: $OPENAI_API_KEY)")
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
        >>> group = TrajectoryGroup([Trajectory(messages_and_choices=[], reward=1.0)])
        >>> _ = Path("groups.jsonl").write_text(group.model_dump_json() + "\\n")
        >>> read_groups(Path("groups.jsonl"))
        [TrajectoryGroup(trajectories=[Trajectory(...reward=1.0...)], ...)]
    """
    try:
        lines = jsonl_lines(path.read_text(encoding="utf-8"))
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


@dataclass
class GroupResult:
    """One group of the input after scoring: its rewards before, and the verdict or error."""

    group: TrajectoryGroup
    before: list[float]
    judgement: Judgement | None = None
    error: str | None = None


def print_table(results: Sequence[GroupResult], out: TextIO) -> None:
    """Print one row per run (reward before, RULER score, explanation) and a line per group."""
    header = (
        f"{'group':>5}  {'run':>3}  {'trajectory':<18}  {'before':>7}  {'ruler':>6}  explanation"
    )
    out.write(header + "\n" + "-" * len(header) + "\n")
    for number, result in enumerate(results, start=1):
        judgement = result.judgement
        if judgement is None:
            out.write(f"{number:>5}  FAILED: {result.error}\n")
            continue
        rows = zip(result.group.trajectories, result.before, judgement.scores, strict=True)
        for run, (trajectory, before, verdict) in enumerate(rows, start=1):
            out.write(
                f"{number:>5}  {run:>3}  {_shorten(trajectory.id, 18):<18}  "
                f"{before:>7.3f}  {verdict.score:>6.3f}  "
                f"{_shorten(verdict.explanation, _EXPLANATION_WIDTH)}\n"
            )
        source = "cache" if judgement.cache_hit else f"{judgement.latency_s:.2f} s"
        out.write(
            f"{'':>5}  group {number}: {judgement.judge_calls} judge call(s), "
            f"{judgement.prompt_tokens} prompt tokens, {judgement.unique_runs} distinct runs, "
            f"{source}\n"
        )


async def _score_all(
    groups: list[TrajectoryGroup], args: argparse.Namespace, options: RulerOptions
) -> list[GroupResult]:
    limit = asyncio.Semaphore(max(1, args.concurrency))

    async def score(group: TrajectoryGroup) -> GroupResult:
        result = GroupResult(group, [t.reward for t in group.trajectories])
        if not group.trajectories:
            result.error = "the group has no trajectories"
            return result
        async with limit:
            try:
                result.judgement = await judge_group(group, args.judge_model, options)
            except Exception as exc:  # one bad group must not stop the others
                result.error = str(exc)
                return result
        apply_judgement(group, result.judgement)
        return result

    return await asyncio.gather(*(score(group) for group in groups))


def _write_jsonl(path: Path, groups: Sequence[TrajectoryGroup]) -> None:
    # Write next to the target and rename, so a crash never leaves half a file behind.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        for group in groups:
            handle.write(group.model_dump_json() + "\n")
    tmp.replace(path)


def _check_args(args: argparse.Namespace) -> RulerOptions:
    """Validate the options up front (so a typo fails once, not per group)."""
    if args.concurrency < 1:
        raise InputError("--concurrency must be at least 1")
    if args.max_tool_result_chars < 0:
        raise InputError("--max-tool-result-chars must be >= 0")
    if not args.timeout > 0:
        raise InputError("--timeout must be positive")
    rubric = DEFAULT_RUBRIC
    if args.rubric is not None:
        try:
            rubric = args.rubric.read_text(encoding="utf-8")
        except OSError as exc:
            raise InputError(f"cannot read rubric {args.rubric}: {exc}") from exc
        if not rubric.strip():
            raise InputError(f"rubric file {args.rubric} is empty")
    options = RulerOptions(
        judge_base_url=args.judge_base_url,
        judge_api_key=args.judge_api_key,
        rubric=rubric,
        max_tool_result_chars=args.max_tool_result_chars,
        request_timeout=args.timeout,
        cache=not args.no_cache,
        cache_path=args.cache_path,
    )
    options.endpoint(args.judge_model)
    return options


def run(args: argparse.Namespace) -> int:
    """Run ``art-core ruler``; return the exit code (0 ok, 1 a group failed, 2 bad input)."""
    try:
        options = _check_args(args)
        groups = read_groups(args.file)
    except ValueError as exc:  # InputError, or the judge's configuration errors
        print(f"art-core ruler: error: {exc}", file=sys.stderr)
        return 2
    results = asyncio.run(_score_all(groups, args, options))
    print_table(results, sys.stdout)
    scored = [r for r in results if r.judgement is not None]
    calls = sum(r.judgement.judge_calls for r in scored if r.judgement)
    tokens = sum(r.judgement.prompt_tokens for r in scored if r.judgement)
    print(
        f"scored {len(scored)}/{len(results)} groups with {calls} judge call(s), "
        f"{tokens} prompt tokens"
    )
    if args.out is not None:
        _write_jsonl(args.out, [r.group for r in scored])
        print(f"wrote {len(scored)} scored groups to {args.out}")
    failed = [str(n) for n, r in enumerate(results, start=1) if r.judgement is None]
    if failed:
        print(
            f"art-core ruler: {len(failed)} group(s) could not be scored: {', '.join(failed)}",
            file=sys.stderr,
        )
        return 1
    return 0
