"""``art-core engines``: which inference engines can run here, and installing vLLM's runtime."""

from __future__ import annotations

import argparse

from art_core.engines.select import choose_engine
from art_core.engines.vllm_runtime import has_cuda, install_vllm_runtime, vllm_status


def report() -> int:
    """Print each engine's availability and what ``engine="auto"`` picks.

    Example:
        >>> report()  # changes process-wide state: caches vLLM's status for the process (a test run installs vLLM meanwhile)  # doctest: +SKIP
    """

    status = vllm_status()
    device = "CUDA" if has_cuda() else "CPU"
    print(f"transformers  available  in-process, {device}")
    print(f"vllm          {'available' if status.available else 'missing  '}  {status.reason}")
    print(f"auto -> {choose_engine()}")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("engines", help="list inference engines; install vLLM's runtime")
    parser.set_defaults(func=lambda args: report())
    actions = parser.add_subparsers(dest="action")
    install = actions.add_parser("install", help="create the vLLM runtime environment")
    install.add_argument("engine", choices=["vllm"])
    # The default is resolved when the command runs (install_vllm_runtime), not here: finding
    # it imports torch, which every other `art-core` command would then pay at start (1.3 s).
    install.add_argument(
        "--kind",
        choices=["cpu", "cuda"],
        default=None,
        help="default: cuda where torch sees a GPU, else cpu",
    )
    install.set_defaults(func=lambda args: print(install_vllm_runtime(args.kind, quiet=False)) or 0)
