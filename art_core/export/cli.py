"""``art-core export MODEL_DIR --out DIR``: export a checkpoint (``export_checkpoint``)."""

from __future__ import annotations

import argparse
import sys

from art_core.export.api import FORMATS, export_checkpoint


def run(args: argparse.Namespace) -> int:
    """Export as ``args`` say; a user error prints its message and returns 2."""
    try:
        result = export_checkpoint(
            args.model_dir,
            args.out,
            format=args.format,
            step=args.step,
            best=args.best,
            higher_is_better=False if args.lower_is_better else None,
            overwrite=args.overwrite,
            art_path=args.art_path,
            gguf_type=args.gguf_type,
        )
    except (ValueError, FileNotFoundError, FileExistsError) as exc:
        print(f"art-core export: {exc}", file=sys.stderr)
        return 2
    files = sorted(p.name for p in result.path.iterdir())
    print(f"exported step {result.step} as {result.format} to {result.path}")
    print(f"base model: {result.base_model}")
    print(f"files: {', '.join(files)}")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``export`` with the ``art-core`` command line."""
    parser = subparsers.add_parser(
        "export",
        help="export a checkpoint as a PEFT adapter, a merged model or a GGUF file",
        description="Export one checkpoint of a trained model (default: the latest) to a "
        "folder of its own, with an export.json saying where it came from.",
    )
    parser.add_argument("model_dir", help="the model's folder: {art_path}/{project}/models/{name}")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, default=None, help="export this step's checkpoint")
    which.add_argument(
        "--best",
        default=None,
        metavar="METRIC",
        help="export the checkpointed step with the best value of this history metric "
        "(e.g. val/reward; higher is better unless the name contains 'loss')",
    )
    parser.add_argument(
        "--lower-is-better", action="store_true", help="with --best: lower values are better"
    )
    parser.add_argument("--format", choices=FORMATS, default="peft", help="default: peft")
    parser.add_argument("--gguf-type", default="f16", help="with --format gguf (default f16)")
    parser.add_argument("--out", required=True, help="the folder to write (must not exist)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    parser.add_argument(
        "--art-path",
        default=None,
        help="where embedded base models are cached (default: the art folder of MODEL_DIR)",
    )

    def func(args: argparse.Namespace) -> int:
        if args.lower_is_better and args.best is None:
            parser.error("--lower-is-better needs --best METRIC")
        return run(args)

    parser.set_defaults(func=func)
