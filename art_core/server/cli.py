"""``art-core serve``: run engine, gateway and trainer as a service for ``RemoteBackend``.

    art-core serve --host 127.0.0.1 --port 7999 --path .art [--token T]

One port carries the OpenAI gateway (``/v1``, ``/rollouts/{id}/v1``) and the backend API
(``/api``). Off loopback a bearer token is required: pass ``--token`` (or set
``ART_CORE_TOKEN``, which keeps it out of the process list) or one is generated and printed.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from art_core.backends.local import LocalBackend
from art_core.gateway.connections import ConnectionLimits
from art_core.server.app import build_app
from art_core.server.service import Service
from art_core.server.settings import ServeSettings, is_loopback
from art_core.server.train_limits import TrainLimits

TOKEN_ENV = "ART_CORE_TOKEN"


def _say(message: str) -> None:
    print(f"art-core serve: {message}", flush=True)


async def serve(settings: ServeSettings, stop: asyncio.Event | None = None) -> int:
    """Serve until ``stop`` is set (or SIGINT/SIGTERM); training in progress is finished first.

    Example:
        >>> asyncio.run(serve(ServeSettings(port=7999)))  # starts a server: on port 7999, until stopped  # doctest: +SKIP
    """
    backend = LocalBackend(
        path=settings.path,
        host=settings.host,
        port=settings.port,
        device=settings.device,
        dtype=settings.dtype,
        max_batch_size=settings.max_batch_size,
        prefix_cache_bytes=settings.prefix_cache_bytes,
        compile_decode=settings.compile_decode,
        default_max_tokens=settings.default_max_tokens,
        max_rollout_memory_mb=settings.max_rollout_memory_mb,
        replicas=settings.replicas,
        threads_per_replica=settings.threads_per_replica,
        replica_devices=settings.replica_devices,
        ray_address=settings.ray_address,
    )
    service = Service(backend, settings)
    backend.server.app = build_app(service)
    backend.server.connection_limits = settings.connection_limits
    try:
        await backend.start()
    except (RuntimeError, TimeoutError) as exc:
        _say(f"cannot listen on {settings.host}:{settings.port}: {exc}")
        return 1
    host = settings.host if ":" not in settings.host else f"[{settings.host}]"
    url = f"http://{host}:{backend.server.port}"
    _say(f"art folder {settings.path}")
    if settings.token is None:
        _say("no token: only this machine can connect (loopback)")
    elif settings.token_generated:
        _say(f"token {settings.token} (generated; choose one with --token or ${TOKEN_ENV})")
    if not is_loopback(settings.host):
        _say("plain HTTP: put TLS in front of it (reverse proxy or SSH tunnel) across networks")
    _say(f"listening on {url}")

    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set():
            os._exit(130)  # a second Ctrl-C: do not wait for the training step
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, on_signal)
        except (NotImplementedError, RuntimeError):  # not the main thread / not Unix
            pass
    await stop.wait()
    _say(
        f"stopping (training in progress may finish for {settings.drain_timeout_s:.0f} s, "
        "then it is cancelled; Ctrl-C again to quit now)"
    )
    await backend.server.call(service.drain())
    await backend.close()
    _say("stopped")
    return 0


def settings_from_args(args: argparse.Namespace) -> ServeSettings:
    """``ServeSettings`` from parsed ``serve`` arguments (the token may come from the env)."""
    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV) or None
    return ServeSettings(
        host=args.host,
        port=args.port,
        path=Path(args.path).resolve(),
        token=token,
        max_body_bytes=int(args.max_body_mb * 1024 * 1024),
        max_pending=args.max_pending,
        retry_after_s=args.retry_after,
        cors_origins=list(args.cors_origin or []),
        allowed_base_models=list(args.allow_base_model or []),
        device=args.device,
        dtype=args.dtype,
        max_batch_size=args.max_batch_size,
        prefix_cache_bytes=(
            None if args.prefix_cache_mb is None else int(args.prefix_cache_mb * 1024 * 1024)
        ),
        compile_decode=args.compile_decode,
        default_max_tokens=args.default_max_tokens,
        stream_interval_s=args.stream_interval,
        max_stream_writes_per_s=args.max_stream_writes,
        replicas=args.replicas,
        threads_per_replica=args.threads_per_replica,
        replica_devices=args.replica_device or None,
        ray_address=args.ray,
        drain_timeout_s=args.drain_timeout,
        export_send_timeout_s=args.export_send_timeout,
        max_export_scratch_bytes=max(1, int(args.max_export_scratch_mb * 1024 * 1024)),
        max_models=args.max_models,
        max_rollout_memory_mb=args.max_rollout_memory_mb,
        connection_limits=ConnectionLimits(
            max_connections=args.max_connections,
            max_idle_connections=args.max_idle_connections,
            header_timeout_s=args.header_timeout,
            body_idle_timeout_s=args.body_timeout,
        ),
        train_limits=TrainLimits(
            max_num_epochs=args.max_num_epochs,
            max_optimizer_steps_per_epoch=args.max_optimizer_steps_per_epoch,
            max_lora_rank=args.max_lora_rank,
            allow_teachers=args.allow_teachers,
        ),
    )


def _run(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_args(args)
        settings.resolved_token()
    except ValueError as exc:
        _say(str(exc))
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return asyncio.run(serve(settings))


def _positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    return parse


def _positive_finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text}")
    return value


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``serve`` with the ``art-core`` command line."""
    parser = subparsers.add_parser(
        "serve",
        help="serve models for RemoteBackend (gateway + training API on one port)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``art-core serve``."""
    _server_arguments(parser)
    _shutdown_and_export_arguments(parser)
    _connection_arguments(parser)
    _training_arguments(parser)
    _engine_arguments(parser)
    parser.set_defaults(func=_run)


def _server_arguments(parser: argparse.ArgumentParser) -> None:
    """Where it listens, who may call it, the requests and models it accepts."""
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    parser.add_argument("--port", type=int, default=7999, help="0 picks a free port")
    parser.add_argument("--path", default=".art", help="the art folder (models, checkpoints)")
    parser.add_argument(
        "--token", default=None, help=f"bearer token clients must send (or ${TOKEN_ENV})"
    )
    parser.add_argument("--max-body-mb", type=_positive(float), default=64.0)
    parser.add_argument(
        "--max-pending",
        type=_positive(int),
        default=512,
        help="chat completions in flight before new ones get 429 + Retry-After",
    )
    parser.add_argument("--retry-after", type=_positive(int), default=1, help="seconds")
    parser.add_argument(
        "--cors-origin", action="append", help="allow this browser origin (CORS is off by default)"
    )
    parser.add_argument(
        "--allow-base-model",
        action="append",
        help="a local model folder clients may name as base_model (embedded models always)",
    )
    parser.add_argument(
        "--max-models",
        type=_positive(int),
        default=ServeSettings.max_models,
        help="models loaded at once (each holds an engine); registering more is a 409",
    )
    parser.add_argument(
        "--max-rollout-memory-mb",
        type=_positive(float),
        default=ServeSettings.max_rollout_memory_mb,
        help="per model, what the calls of unreleased rollouts may hold in memory; past it the "
        "least recently active rollouts are kept on disk only (read back if they go on)",
    )


def _shutdown_and_export_arguments(parser: argparse.ArgumentParser) -> None:
    """How it drains on shutdown and how far exports in flight may go."""
    parser.add_argument(
        "--drain-timeout",
        type=_positive(float),
        default=120.0,
        help="on SIGTERM/Ctrl-C, seconds to let training steps in progress finish before "
        "cancelling them (a cancelled step writes nothing; the previous checkpoint stays)",
    )
    parser.add_argument(
        "--export-send-timeout",
        type=_positive_finite,
        default=ServeSettings.export_send_timeout_s,
        help="seconds an export download may wait for the client to take its next MiB; "
        "beyond, the download is cut and its scratch copy removed",
    )
    parser.add_argument(
        "--max-export-scratch-mb",
        type=_positive_finite,
        default=ServeSettings.max_export_scratch_bytes / (1024 * 1024),
        help="scratch space exports in flight may hold together (default 64 GiB); an export "
        "that would pass it gets 503 + Retry-After",
    )


def _connection_arguments(parser: argparse.ArgumentParser) -> None:
    """The limits on client connections (``ConnectionLimits``)."""
    connections = ConnectionLimits()
    parser.add_argument(
        "--max-connections",
        type=_positive(int),
        default=connections.max_connections,
        help="open connections at most (lowered to fit the file descriptor limit)",
    )
    parser.add_argument(
        "--max-idle-connections",
        type=_positive(int),
        default=connections.max_idle_connections,
        help="connections that have not sent a request yet; beyond, the oldest idle for 2 s "
        "is closed",
    )
    parser.add_argument(
        "--header-timeout",
        type=_positive(float),
        default=connections.header_timeout_s,
        help="seconds a connection has to deliver a request's headers",
    )
    parser.add_argument(
        "--body-timeout",
        type=_positive(float),
        default=connections.body_idle_timeout_s,
        help="seconds a request body may stall before the request is dropped",
    )


def _training_arguments(parser: argparse.ArgumentParser) -> None:
    """What one training request may ask (``TrainLimits``)."""
    limits = TrainLimits()
    parser.add_argument(
        "--max-num-epochs",
        type=_positive(int),
        default=limits.max_num_epochs,
        help="most passes over the data one training request may ask (num_epochs, SFT epochs)",
    )
    parser.add_argument(
        "--max-optimizer-steps-per-epoch",
        type=_positive(int),
        default=limits.max_optimizer_steps_per_epoch,
    )
    parser.add_argument("--max-lora-rank", type=_positive(int), default=limits.max_lora_rank)
    parser.add_argument(
        "--allow-teachers",
        action="store_true",
        help="let training requests name a distillation teacher (TrainConfig.teacher): a model "
        "path this server loads or a URL it calls",
    )


def _engine_arguments(parser: argparse.ArgumentParser) -> None:
    """The inference engines: device, batching, prefix cache and replicas."""
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--max-batch-size", type=_positive(int), default=32)
    parser.add_argument(
        "--prefix-cache-mb",
        type=_non_negative_float,
        default=None,
        help="per engine, the KV of prompt prefixes kept so a group's runs and an agent's "
        "next turn do not prefill them again (default: an eighth of free memory, a quarter "
        "of a GPU's; 0: off)",
    )
    parser.add_argument(
        "--compile-decode",
        action="store_true",
        help="the transformers engine's decode steps compiled with torch.compile (compiled "
        "and checked against the eager step when a model is loaded; about a minute for a "
        "135M model on 2 CPU cores, cached on disk)",
    )
    parser.add_argument("--default-max-tokens", type=_positive(int), default=1024)
    parser.add_argument(
        "--stream-interval",
        type=_non_negative_float,
        default=ServeSettings.stream_interval_s,
        help="seconds a streamed answer waits between two writes, the tokens sampled "
        "meanwhile sent together (its first text and its end are sent at once; 0: every "
        "batch of tokens as it comes)",
    )
    parser.add_argument(
        "--max-stream-writes",
        type=_positive_finite,
        default=ServeSettings.max_stream_writes_per_s,
        help="writes a second all streamed answers make together, about, at most: with "
        "many streams open each writes less often than --stream-interval",
    )
    parser.add_argument(
        "--replicas",
        type=_positive(int),
        default=1,
        help="engine replicas per model: engine worker processes behind the gateway, each "
        "rollout's calls on one of them (1: the engine runs in this process)",
    )
    parser.add_argument(
        "--threads-per-replica",
        type=_positive(int),
        default=None,
        help="CPU threads of each replica (default: the cores split evenly)",
    )
    parser.add_argument(
        "--replica-device",
        action="append",
        help="a device for the replicas, in turn (repeat: --replica-device cuda:0 ...)",
    )
    parser.add_argument(
        "--ray",
        default=None,
        metavar="auto|ADDRESS",
        help="run the replicas as Ray actors on this cluster (auto: the running one, or a "
        "new local one); needs art-core[ray]",
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m art_core.server.cli [options]``: ``art-core serve`` without the other
    subcommands (and without loading integrations' entry points).

    Example:
        >>> main(["--port", "0"])  # starts a server: until stopped  # doctest: +SKIP
    """
    parser = argparse.ArgumentParser(
        prog="art-core serve",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return _run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
