"""Training past one device: data-parallel LoRA GRPO on ``torch.distributed``.

``TrainingWorld`` says how many ranks, on which devices, launched how (local processes or a
Ray actor group), and whether FSDP2 shards the frozen base. ``DistributedTrainer`` is a
``Trainer`` whose steps run on that world: ``coordinator`` (split and commit), ``rank``
(one rank's share of a step), ``balance`` (token-balanced split), ``fsdp`` (sharding),
``local_group`` / ``ray_group`` (launchers; ``rank_forks``: local ranks forked from one
warmed-up process), ``messages`` (the JSON they exchange).

Example:
    >>> from art_core.training.distributed import DistributedTrainer, TrainingWorld
    >>> world = TrainingWorld(ranks=2, devices=("cpu", "cpu"), threads_per_rank=1)
    >>> trainer = DistributedTrainer(base_model_path, model_dir, world)   # fragment: a model's `base_model_path`, `model_dir`  # doctest: +SKIP
"""

from art_core.training.distributed.coordinator import DistributedTrainer, TrainingWorldError
from art_core.training.distributed.world import TrainingWorld

__all__ = ["DistributedTrainer", "TrainingWorld", "TrainingWorldError"]
