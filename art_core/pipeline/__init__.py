"""Pipelined training: sampling never stops while the model trains (``PipelineTrainer``)."""

from art_core.pipeline.trainer import PipelineState, PipelineTrainer, make_group_rollout_fn

__all__ = ["PipelineState", "PipelineTrainer", "make_group_rollout_fn"]
