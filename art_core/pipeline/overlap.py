"""Whether the pipeline overlaps sampling and training: decided by what a step would gain, with
the cost of training on older groups counted, from the parts of a lock-step step.

Overlapping the two sides of a step (the sampler fills the next batch while the trainer trains
this one) shortens a step at best to its longer side, and every group it trains then comes
from the policy one step back. Older groups teach less: on a 2-core Intel Xeon (AMX), the
``bench pipeline`` task overlapped at 2.25 s a step against 4.06 s lock-step (1.8x faster
steps) and needed 24 steps and 73 s to the train reward lock-step reached in 11 steps and
23 s. So overlap must at least double the rate of steps before it is chosen
(``OVERLAP_MIN_SPEEDUP``); below that, the run is faster to its reward lock-step.

The decision needs no overlapped probe steps (on a 2-core AMD EPYC, the four probe steps and
the groups they left stale made the default 2.1x slower to its reward than lock-step): a
lock-step step is split into waiting for its batch (sampling) and training, each with the
CPU time the process spent on it. Where both sides share this process's cores
(``CoreSplit``), overlapping gives each side only its share of them, and a side that kept
more cores busy than its share slows in proportion; a side that mostly waited (on tools, on
a remote engine) does not. Only where the prediction clears the bar is overlap tried, and
then kept only if the measured overlapped step confirms it (``choose_overlap``).
"""

from __future__ import annotations

from dataclasses import dataclass

from art_core.cpu import CoreSplit

# Lock-step steps before the choice; the last one is measured (the first carries the start:
# loading the model, the first batch's prompts).
PROBE_STEPS = 2
# Overlap must make steps this much faster: its groups are a step older, and on the one task
# measured that cost 2.2x the steps (see the module's docstring).
OVERLAP_MIN_SPEEDUP = 2.0


@dataclass(frozen=True)
class StepSplit:
    """The two sides of one lock-step step: sampling its batch and training it, in wall
    seconds and in this process's CPU seconds (every thread's).

    Example:
        >>> StepSplit(sample_s=3.0, train_s=1.0, sample_cpu_s=5.4, train_cpu_s=1.9).period_s
        4.0
    """

    sample_s: float
    train_s: float
    sample_cpu_s: float
    train_cpu_s: float

    def __post_init__(self) -> None:
        for name in ("sample_s", "train_s", "sample_cpu_s", "train_cpu_s"):
            value = getattr(self, name)
            if not value >= 0:  # NaN too
                raise ValueError(f"{name} must be >= 0, got {value}")

    @property
    def period_s(self) -> float:
        """The step's wall time: one side after the other."""
        return self.sample_s + self.train_s


def _on_share(wall_s: float, cpu_s: float, cores: int, threads: int) -> float:
    """How long a side that took ``wall_s`` (and ``cpu_s`` of CPU) on all ``cores`` takes
    on ``threads`` of them: at least its CPU time spread over its share."""
    return max(wall_s, cpu_s / max(1, min(threads, cores)))


def predict_overlap_speedup(split: StepSplit, cores: CoreSplit | None) -> tuple[float, float]:
    """The overlapped step's predicted period and its speedup over ``split``'s lock-step one.

    ``cores`` is how the sides would share this process's cores when overlapped, or None
    where sampling runs elsewhere (another process, device or machine) and overlap slows
    neither side.

    Example:
        >>> busy = StepSplit(sample_s=3.0, train_s=1.0, sample_cpu_s=5.8, train_cpu_s=1.9)
        >>> predict_overlap_speedup(busy, CoreSplit(cores=2, sampler_threads=1, trainer_threads=1))
        (5.8, 0.6896551724137931)
        >>> predict_overlap_speedup(busy, None)  # each side on its own device
        (3.0, 1.3333333333333333)
    """
    if cores is None:
        period = max(split.sample_s, split.train_s)
    else:
        period = max(
            _on_share(split.sample_s, split.sample_cpu_s, cores.cores, cores.sampler_threads),
            _on_share(split.train_s, split.train_cpu_s, cores.cores, cores.trainer_threads),
        )
    period = max(period, 1e-9)
    return period, split.period_s / period


def predicted_choice(split: StepSplit, cores: CoreSplit | None) -> tuple[bool, str]:
    """Whether to try overlap after a lock-step step split as ``split``; and why.

    Example:
        >>> waits = StepSplit(sample_s=6.0, train_s=5.0, sample_cpu_s=0.3, train_cpu_s=9.0)
        >>> predicted_choice(waits, None)[0]  # at best 11 s -> 6 s: less than 2x
        False
    """
    period, speedup = predict_overlap_speedup(split, cores)
    figures = (
        f"a lock-step step took {split.period_s:.2f} s (sampling {split.sample_s:.2f} s, "
        f"{split.sample_cpu_s:.2f} CPU-s; training {split.train_s:.2f} s, "
        f"{split.train_cpu_s:.2f} CPU-s)"
        + (
            ""
            if cores is None
            else f"; overlapped, sampling would get {cores.sampler_threads} and training "
            f"{cores.trainer_threads} of {cores.cores} cores"
        )
        + f": overlapped at best {period:.2f} s, {speedup:.2f}x"
    )
    if speedup >= OVERLAP_MIN_SPEEDUP:
        return True, f"overlap may pay here ({figures}): trying it"
    return False, (
        f"overlap cannot pay here ({figures}, under the {OVERLAP_MIN_SPEEDUP:.1f}x that "
        "training on groups a step older costs): training lock-step "
        "(PipelineTrainer(overlap=True) overlaps anyway)"
    )


def choose_overlap(lock_step_s: float, overlapped_s: float) -> tuple[bool, str]:
    """Whether to keep overlapping, from the measured period of a step in each mode (seconds
    from the end of one trained step to the end of the next); and why.

    Example:
        >>> choose_overlap(10.0, 4.0)[0], choose_overlap(10.0, 7.0)[0]
        (True, False)
    """
    if not (lock_step_s > 0 and overlapped_s > 0):
        raise ValueError(f"periods must be > 0, got {lock_step_s} and {overlapped_s}")
    ratio = lock_step_s / overlapped_s
    figures = f"a step takes {lock_step_s:.2f} s lock-step, {overlapped_s:.2f} s overlapped"
    if ratio >= OVERLAP_MIN_SPEEDUP:
        return True, f"overlap pays here ({figures}: {ratio:.2f}x): training while sampling"
    return False, (
        f"overlap does not pay here ({figures}: {ratio:.2f}x, under the "
        f"{OVERLAP_MIN_SPEEDUP:.1f}x that training on groups a step older costs): training "
        "lock-step (PipelineTrainer(overlap=True) overlaps anyway)"
    )
