"""``PipelineTrainer``: sampling never stops while the model trains, with bounded staleness.

The lock-step loop (gather, train, repeat) leaves the sampler idle while the trainer runs
and the trainer idle while the sampler runs. Here rollout workers keep running groups on the
adapter served at the moment; finished groups queue; the trainer takes a batch, trains it
while the engine keeps serving (``backend.train(..., serve_while_training=True)``: on other
cores, or another device), and the new adapter is loaded between two decode steps.

Staleness is bounded and corrected, not hidden:

- a group's **policy age** is how many steps the model has moved since its oldest call was
  sampled (its recorded ``adapter_step``); a group older than ``max_steps_off_policy`` when
  a batch is assembled is dropped and counted, never trained on;
- the loss's importance ratio compares with the sampler's recorded logprobs, with truncated
  importance sampling on by default (``TrainConfig.truncated_importance_sampling=2.0``);
- each step's history record says the policy age of what it trained (mean, max) and what
  was dropped (stale, no signal).

Overlap is not free: on one machine the sampler and the trainer split its cores, and each
runs slower on its share; and every group an overlapped step trains is a step older. So by
default (``overlap=None``) the pipeline trains its first ``PROBE_STEPS`` steps lock-step,
splits the last one into sampling and training (wall and CPU seconds), and tries overlap
only where that split predicts at least ``OVERLAP_MIN_SPEEDUP`` faster steps, keeping it only
if the measured overlapped step confirms it (``pipeline/overlap.py``); it says which it
chose and why. ``overlap=True`` / ``False`` fixes the mode.

No group is started that would be stale before it trains: a worker starts a group only for
the batch being filled (lock-step: every group is sampled by the policy it trains), or,
overlapped with ``max_steps_off_policy >= 1``, for the next batch while this one trains.

Overlapped, a group that fails or is dropped (no signal, stale) is replaced, and a step takes
``groups_per_step`` groups with a signal. Lock-step, a step samples one round of
``groups_per_step`` groups and trains those of them with a signal (another round only when
none has one), as the plain gather-and-train loop does: a replacement would be sampled alone,
a round that keeps the engine a fraction full while the trainer waits. On the digits
benchmark (``bench pipeline``, medians of three runs, seconds to a train reward of 0.9; the
plain loop 20-22 s), replacing each dropped group took 29 s, starting 1 / (share of recent
groups with a signal) groups at once and training all of them 28 s, one round a step 24 s.

The pipeline's position (which scenarios are done) is saved after every step, so a restarted
pipeline continues at its latest checkpoint and the next scenario.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm.auto import tqdm

from art_core.backends.base import Backend
from art_core.cpu import CoreSplit
from art_core.files import atomic_write_text
from art_core.pipeline.overlap import (
    PROBE_STEPS,
    StepSplit,
    choose_overlap,
    predicted_choice,
)
from art_core.trajectories import Trajectory, TrajectoryGroup

if TYPE_CHECKING:
    from art_core.model import TrainableModel
    from art_core.training.config import TrainConfig, TrainResult

logger = logging.getLogger(__name__)
RolloutFn = Callable[..., Awaitable[Trajectory | TrajectoryGroup]]
EvalFn = Callable[..., Any]
STATE_VERSION = 1
__all__ = [
    "PROBE_STEPS",
    "PipelineState",
    "PipelineTrainer",
    "choose_overlap",
    "make_group_rollout_fn",
]


def make_group_rollout_fn(single_rollout_fn: RolloutFn, n: int = 4) -> RolloutFn:
    """A rollout function returning a group of ``n`` runs of ``single_rollout_fn`` (ART's).

    Example:
        >>> from art_core import Trajectory
        >>> async def rollout(model, scenario):  # a stand-in for a real rollout
        ...     return Trajectory(messages_and_choices=[{"role": "user", "content": scenario}], reward=1.0)
        >>> group_fn = make_group_rollout_fn(rollout, n=8)
        >>> len(await group_fn(None, "Weather in Paris?"))
        8
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")

    async def group_rollout(model: Any, scenario: Any, *config: Any) -> TrajectoryGroup:
        runs: Any = (single_rollout_fn(model, scenario, *config) for _ in range(n))
        return await TrajectoryGroup(runs)

    return group_rollout


@dataclass
class _Sampled:
    """A finished group waiting in the queue."""

    group: TrajectoryGroup
    scenario_index: int
    oldest_step: int
    rollouts: int


@dataclass
class PipelineState:
    """Where a pipeline stands: scenarios done (trained, dropped or failed) and counters."""

    next_scenario: int = 0  # every scenario before this index is done
    done_beyond: list[int] = field(default_factory=list)  # done scenarios at or after it
    steps: int = 0
    groups_trained: int = 0
    dropped_stale: int = 0
    dropped_no_signal: int = 0
    failed_groups: int = 0
    rollouts: int = 0

    def mark_done(self, index: int) -> None:
        done = set(self.done_beyond) | {index}
        while self.next_scenario in done:
            done.discard(self.next_scenario)
            self.next_scenario += 1
        self.done_beyond = sorted(i for i in done if i >= self.next_scenario)

    def is_done(self, index: int) -> bool:
        return index < self.next_scenario or index in self.done_beyond

    def to_json(self) -> str:
        return json.dumps({"version": STATE_VERSION, **self.__dict__})

    @classmethod
    def load(cls, path: Path) -> PipelineState:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or data.pop("version", None) != STATE_VERSION:
            raise ValueError(f"{path} is not a pipeline state this version can read")
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


class PipelineTrainer:
    """Train while sampling: rollouts run continuously; the trainer takes full batches.

    Arguments keep OpenPipe ART's names where they mean the same; both call shapes work:
    ``PipelineTrainer(model, rollout_fn, scenarios, ...)`` and ART's
    ``PipelineTrainer(model, backend, rollout_fn, scenarios, config, eval_fn, ...)``.

    - ``rollout_fn(model, scenario[, config])`` returns a ``TrajectoryGroup``, or, with
      ``group_size=N``, one ``Trajectory`` (run N times per scenario);
    - ``groups_per_step`` (ART: ``min_batch_size``): groups trained per step;
    - ``max_steps_off_policy``: the oldest policy a trained group may come from, in steps;
    - ``num_rollout_workers``: groups sampled at once (default: ``groups_per_step``);
    - ``train_config`` / ``learning_rate`` / ``loss_fn`` / ``normalize_advantages`` /
      ``kl_penalty_coef``: the step's settings;
    - ``eval_fn(model, step[, config])`` every ``eval_every_n_steps`` steps (and at the
      start with ``eval_at_start``): its trajectories or groups are logged as ``val``;
    - ``max_steps``: stop after this many steps (else when the scenarios run out);
    - ``max_groups_without_signal``: stop (with a warning) after this many groups in a row
      whose rewards were all equal and so were dropped: a solved (or hopeless) task on
      endless scenarios would otherwise wait forever for a group to train on (None: wait);
    - ``resume``: continue from the saved position (``pipeline_state.json``);
    - ``overlap``: ``None`` (default) decides from the split of its first lock-step steps
      (see the module's docstring); ``True`` trains while the engine serves on its own share
      of the device; ``False`` trains lock-step (the engine paused during a step, each side
      on the whole device in turn).

    Example:
        >>> import art_core as art
        >>> trainer = art.PipelineTrainer(model, rollout, scenarios, group_size=8,
        ...                               groups_per_step=4, max_steps_off_policy=1)  # needs a registered model: `model`, `rollout`, `scenarios`  # doctest: +SKIP
        >>> await trainer.train()  # needs a registered model  # doctest: +SKIP
    """

    def __init__(
        self,
        model: TrainableModel,
        *args: Any,
        backend: Backend | None = None,
        rollout_fn: RolloutFn | None = None,
        scenarios: Iterable[Any] | AsyncIterator[Any] | None = None,
        config: Any = None,
        eval_fn: EvalFn | None = None,
        group_size: int | None = None,
        groups_per_step: int | None = None,
        min_batch_size: int | None = None,
        num_rollout_workers: int | None = None,
        max_steps_off_policy: int = 1,
        max_steps: int | None = None,
        train_config: TrainConfig | None = None,
        learning_rate: float | None = None,
        loss_fn: str | None = None,
        normalize_advantages: bool | None = None,
        kl_penalty_coef: float | None = None,
        eval_every_n_steps: int = 0,
        eval_at_start: bool = False,
        keep_groups_without_signal: bool = False,
        max_groups_without_signal: int | None = 256,
        queue_maxsize: int | None = None,
        resume: bool = True,
        state_path: str | Path | None = None,
        progress: bool = True,
        overlap: bool | None = None,
    ) -> None:
        backend, rollout_fn, scenarios, config, eval_fn = _art_call_shape(
            args, backend, rollout_fn, scenarios, config, eval_fn
        )
        batch = _checked_batch(
            group_size=group_size,
            groups_per_step=groups_per_step,
            min_batch_size=min_batch_size,
            max_steps_off_policy=max_steps_off_policy,
            eval_every_n_steps=eval_every_n_steps,
            max_groups_without_signal=max_groups_without_signal,
            max_steps=max_steps,
        )
        self.model = model
        self.backend = backend
        # A group, or with group_size one Trajectory: _run_group checks what came back.
        self.rollout_fn: Any = rollout_fn
        self.scenarios = scenarios
        self.config = config
        self.eval_fn = eval_fn
        self.group_size = group_size
        self.groups_per_step = batch
        self.num_rollout_workers = num_rollout_workers or batch
        self.max_steps_off_policy = max_steps_off_policy
        self.max_steps = max_steps
        self.train_config = self._train_config(
            train_config, learning_rate, loss_fn, normalize_advantages, kl_penalty_coef
        )
        self.eval_every_n_steps = eval_every_n_steps
        self.eval_at_start = eval_at_start
        self.keep_groups_without_signal = keep_groups_without_signal
        self.max_groups_without_signal = max_groups_without_signal
        self._without_signal_in_a_row: list[float] = []  # those groups' mean rewards
        self.stopped_without_signal = False
        self.queue_maxsize = queue_maxsize or 2 * batch
        self.resume = resume
        self.state_path = Path(state_path) if state_path is not None else None
        self.progress = progress
        self.state = PipelineState()
        self.results: list[TrainResult] = []
        self._rollout_arity = _arity(rollout_fn)
        self.overlap = overlap
        # The mode chosen by measuring (overlap=None), and why; None until chosen.
        self.overlap_chosen: bool | None = None
        self.overlap_reason: str | None = None
        # Measured step periods (seconds) by mode, while choosing; the last lock-step split.
        self._periods: dict[bool, list[float]] = {False: [], True: []}
        self._split: StepSplit | None = None
        self._overlap_predicted = False
        # How sampling and training share this process's cores when overlapped (None: the
        # sampler runs elsewhere); from the backend.
        self._core_split: CoreSplit | None = None
        # Starting groups (see the module's docstring): a worker takes a ticket per group.
        # ``_backlog``: groups started and not yet taken off the queue by the trainer;
        # ``_filling``: groups already in the batch being assembled.
        self._tickets = asyncio.Semaphore(0)
        self._open_tickets = 0
        self._backlog = 0
        self._filling = 0
        self._stream_done = False
        self._hold = False  # True while a step trains that no new group may sample beside

    @staticmethod
    def _train_config(
        config: TrainConfig | None,
        learning_rate: float | None,
        loss_fn: str | None,
        normalize_advantages: bool | None,
        kl_penalty_coef: float | None,
    ) -> TrainConfig:
        # Pydantic models: kept off `import art_core` (~15 ms).
        from art_core.training.config import TrainConfig

        base = config or TrainConfig(truncated_importance_sampling=2.0)
        updates: dict[str, Any] = {}
        if learning_rate is not None:
            updates["learning_rate"] = learning_rate
        if loss_fn is not None:
            updates["loss"] = loss_fn
        if normalize_advantages is not None:
            updates["scale_rewards"] = normalize_advantages
        if kl_penalty_coef is not None:
            updates["beta"] = kl_penalty_coef
        if not updates:
            return base
        return TrainConfig.model_validate({**base.model_dump(), **updates})

    # ------------------------------------------------------------------------------ state
    def _state_file(self) -> Path:
        if self.state_path is not None:
            return self.state_path
        folder = getattr(self._backend(), "model_folder", None)
        if folder is not None:
            return Path(folder(self.model).pipeline_state)
        # A remote backend keeps the model's folder on its server: the position stays here.
        return (
            Path(".art") / self.model.project / "models" / self.model.name / "pipeline_state.json"
        )

    def _save_state(self) -> None:
        atomic_write_text(self._state_file(), self.state.to_json())

    def _backend(self) -> Backend:
        return self.backend if self.backend is not None else self.model.backend()

    # ------------------------------------------------------------------------------ rollouts
    async def _scenario_stream(self) -> AsyncGenerator[tuple[int, Any], None]:
        index = 0
        if isinstance(self.scenarios, AsyncIterator):
            async for scenario in self.scenarios:
                if not self.state.is_done(index):
                    yield index, scenario
                index += 1
        else:
            for scenario in self.scenarios:
                if not self.state.is_done(index):
                    yield index, scenario
                index += 1

    async def _run_group(self, scenario: Any) -> TrajectoryGroup:
        extra = (self.config,) if self._rollout_arity >= 3 else ()
        if self.group_size is not None:
            group = TrajectoryGroup(
                self.rollout_fn(self.model, scenario, *extra) for _ in range(self.group_size)
            )
            return await group
        result: Any = await self.rollout_fn(self.model, scenario, *extra)
        if isinstance(result, TrajectoryGroup):
            return await result if result.pending else result
        if isinstance(result, Trajectory):
            raise TypeError(
                "rollout_fn returned one Trajectory: pass group_size=N to run it N times per "
                "scenario, or return a TrajectoryGroup"
            )
        raise TypeError(f"rollout_fn returned {type(result).__name__}, not a TrajectoryGroup")

    async def _worker(
        self,
        stream: AsyncGenerator[tuple[int, Any], None],
        stream_lock: asyncio.Lock,
        queue: asyncio.Queue[_Sampled | None],
    ) -> None:
        while True:
            await self._tickets.acquire()  # a group the next batches need (see _top_up)
            # In the backlog from the ticket on (not only once its scenario is read): a
            # lock-step batch waits until its round's groups are all in.
            self._open_tickets -= 1
            self._backlog += 1
            if not self._stream_done:
                async with stream_lock:
                    item = await anext(stream, None)
                self._stream_done = item is None
            if self._stream_done:
                self._backlog -= 1
                self._release(1)  # wakes the next waiting worker: it ends too
                return
            assert item is not None
            index, scenario = item
            try:
                group = await self._run_group(scenario)
            except Exception as exc:  # a group that failed as a whole: counted, replaced
                logger.warning("scenario %d failed: %s: %s", index, type(exc).__name__, exc)
                self.state.failed_groups += 1
                self.state.mark_done(index)
                self._backlog -= 1
                self._top_up()
                continue
            steps = [c.adapter_step for t in group.trajectories for c in t.calls]
            oldest = min(steps) if steps else await self._backend().get_step(self.model)
            rollouts = len(group.trajectories) + len(group.exceptions)
            self.state.rollouts += rollouts
            self._sampled += rollouts
            await queue.put(_Sampled(group, index, oldest, rollouts))

    def _release(self, tickets: int) -> None:
        self._open_tickets += tickets
        for _ in range(tickets):
            self._tickets.release()

    def _top_up(self) -> None:
        """Let workers start as many groups as the batch being filled still needs, counting
        those running or queued (and, between batches, the next batch's), unless a step
        trains beside which a new group would go stale."""
        if self._hold:
            return
        self._release(
            max(0, self.groups_per_step - self._filling - self._backlog - self._open_tickets)
        )

    # ------------------------------------------------------------------------------ training
    async def _next_batch(
        self, queue: asyncio.Queue[_Sampled | None], current_step: int
    ) -> tuple[list[_Sampled], dict[str, int]]:
        """The groups of the next step (see the module's docstring): overlapped,
        ``groups_per_step`` fresh groups with a signal; lock-step, those of one round of
        ``groups_per_step`` groups; any fresh groups when a distillation teacher learns from
        all-equal ones too; fewer at the very end."""
        batch: list[_Sampled] = []
        dropped = {"stale": 0, "no_signal": 0}
        lock_step = not self._overlap_now()
        while not self.stopped_without_signal:
            if not lock_step and len(batch) >= self.groups_per_step:
                break
            if lock_step and self._backlog == 0 and self._open_tickets == 0:
                if batch:  # the round is in: train what it brought
                    break
                self._top_up()  # the round had no signal at all: another one
            item = await queue.get()
            if item is None:  # every worker is done: leave the mark for the next call
                queue.put_nowait(None)
                break
            self._backlog -= 1
            if current_step - item.oldest_step > self.max_steps_off_policy:
                dropped["stale"] += 1
                self.state.mark_done(item.scenario_index)
                if not lock_step:
                    self._top_up()
            elif not item.group.has_signal and not (
                # A teacher learns from all-equal groups too (the trainer keeps them).
                self.keep_groups_without_signal or self.train_config.trains_equal_groups
            ):
                dropped["no_signal"] += 1
                self.state.mark_done(item.scenario_index)
                if not lock_step:
                    self._top_up()
                if self._starved(item.group):
                    break  # train what was gathered; the next call returns nothing
            else:
                self._without_signal_in_a_row.clear()
                batch.append(item)
                self._filling = len(batch)
        self.state.dropped_stale += dropped["stale"]
        self.state.dropped_no_signal += dropped["no_signal"]
        return batch, dropped

    def _starved(self, group: TrajectoryGroup) -> bool:
        """Count a dropped all-equal group; True (after a warning) once
        ``max_groups_without_signal`` came in a row."""
        rewards = [t.reward for t in group.trajectories]
        self._without_signal_in_a_row.append(sum(rewards) / len(rewards) if rewards else 0.0)
        limit = self.max_groups_without_signal
        if limit is None or len(self._without_signal_in_a_row) < limit:
            return False
        mean = sum(self._without_signal_in_a_row) / len(self._without_signal_in_a_row)
        logger.warning(
            "PipelineTrainer stops: the last %d groups each had equal rewards (mean %.3f), so "
            "none could be trained on; the task looks solved (or out of reach). Pass "
            "keep_groups_without_signal=True or max_groups_without_signal=None to go on.",
            limit,
            mean,
        )
        self.stopped_without_signal = True
        return True

    # ------------------------------------------------------------------------------ overlap
    def _overlap_now(self) -> bool:
        """The mode of the next step: fixed, chosen, trying overlap, or probing lock-step."""
        if self.overlap is not None:
            return self.overlap
        if self.overlap_chosen is not None:
            return self.overlap_chosen
        return self._overlap_predicted  # overlapped steps run only once it was predicted

    def _observe(self, overlapped: bool, period_s: float, split: StepSplit) -> None:
        """Record a step while choosing: after ``PROBE_STEPS`` lock-step ones, predict from
        the last one's split; when trying overlap, keep it only if its second step (the first
        still carries the lock-step batch) confirms the prediction."""
        if self.overlap is not None or self.overlap_chosen is not None:
            return
        self._periods[overlapped].append(period_s)
        if not overlapped:
            self._split = split
            if len(self._periods[False]) >= PROBE_STEPS:
                worth_trying, reason = predicted_choice(split, self._core_split)
                if worth_trying:
                    self._overlap_predicted = True
                    logger.info("PipelineTrainer: %s", reason)
                else:
                    self._choose(False, reason)
            return
        if len(self._periods[True]) >= 2:
            self._choose(*choose_overlap(self._periods[False][-1], self._periods[True][-1]))

    def _choose(self, overlapped: bool, reason: str) -> None:
        self.overlap_chosen, self.overlap_reason = overlapped, reason
        (logger.info if overlapped else logger.warning)("PipelineTrainer: %s", reason)

    def _check_overlap_possible(self) -> None:
        """Refused overlap (sampling and training on one device) is an error when asked for,
        and settles the choice on lock-step when choosing. Asked for, the cores are split
        now; choosing, only planned (the probe steps sample and train on every core)."""
        if self.overlap is False or self.overlap_chosen is not None:
            return
        name = "prepare_serve_while_training" if self.overlap else "plan_serve_while_training"
        prepare = getattr(self._backend(), name, None)
        if prepare is None:
            return
        try:
            self._core_split = prepare(self.model)
        except ValueError as exc:
            if self.overlap:
                raise
            self._choose(False, f"overlap is not possible here ({exc})")

    async def train(self) -> list[TrainResult]:
        """Run the pipeline until ``max_steps`` steps trained or the scenarios ran out;
        returns the results of the steps trained by this call."""
        self._check_overlap_possible()
        state_file = self._state_file()
        if self.resume and state_file.is_file():
            self.state = PipelineState.load(state_file)
            logger.info(
                "pipeline resumes at step %d, scenario %d",
                await self.model.get_step(),
                self.state.next_scenario,
            )
        if self.eval_fn is not None and self.eval_at_start:
            await self._evaluate(await self.model.get_step())
        queue: asyncio.Queue[_Sampled | None] = asyncio.Queue(maxsize=self.queue_maxsize)
        stream = self._scenario_stream()
        stream_lock = asyncio.Lock()
        self._sampled = 0
        self._tickets, self._open_tickets, self._backlog = asyncio.Semaphore(0), 0, 0
        self._filling, self._stream_done, self._hold = 0, False, False
        self._top_up()
        workers = [
            asyncio.ensure_future(self._worker(stream, stream_lock, queue))
            for _ in range(self.num_rollout_workers)
        ]

        async def close_queue_when_done() -> None:
            await asyncio.gather(*workers, return_exceptions=True)
            await queue.put(None)

        closer = asyncio.ensure_future(close_queue_when_done())
        bar = tqdm(total=self.max_steps, desc="pipeline", unit="step", disable=not self.progress)
        started = time.perf_counter()
        trained_here: list[TrainResult] = []
        # A step's period runs from the end of the previous one (evaluations excluded).
        period_start, cpu_mark = started, time.process_time()
        try:
            while self.max_steps is None or self.state.steps < self.max_steps:
                current = await self.model.get_step()
                batch, dropped = await self._next_batch(queue, current)
                if not batch:
                    break
                result = await self._step(
                    batch, current, dropped, queue, started, (period_start, cpu_mark)
                )
                trained_here.append(result)
                self.results.append(result)
                bar.update(1)
                bar.set_postfix(_postfix(result.metrics), refresh=False)
                for diagnosis in result.diagnoses if self.progress else ():
                    bar.write(f"step {result.step} why: {diagnosis.line()}")  # learned little
                if self.eval_fn is not None and self.eval_every_n_steps:
                    if self.state.steps % self.eval_every_n_steps == 0:
                        await self._evaluate(result.step)
                period_start, cpu_mark = time.perf_counter(), time.process_time()
        finally:
            bar.close()
            for task in [*workers, closer]:
                task.cancel()
            await asyncio.gather(*workers, closer, return_exceptions=True)
            await stream.aclose()
            # The engine gets back the cores it lent the trainer (sampling after the
            # pipeline, an evaluation, runs on all of them).
            end_split = getattr(self._backend(), "end_serve_while_training", None)
            if end_split is not None:
                await end_split(self.model)
        return trained_here

    async def _step(
        self,
        batch: list[_Sampled],
        current: int,
        dropped: dict[str, int],
        queue: asyncio.Queue[_Sampled | None],
        started: float,
        marks: tuple[float, float],
    ) -> TrainResult:
        """Train ``batch`` in the mode of the moment, starting the next batch's groups when
        they may start, and measure the step's split (``marks``: wall and CPU clock at the
        end of the previous step)."""
        period_start, cpu_mark = marks
        overlapped = self._overlap_now()
        sampled_at, sampled_cpu = time.perf_counter(), time.process_time()
        # The next batch's groups start now only where they may sample beside this step and
        # still be fresh enough when trained; else once it has trained.
        self._filling = 0
        self._hold = not (overlapped and self.max_steps_off_policy >= 1)
        self._top_up()
        result = await self._train_batch(
            batch, current, dropped, queue, started, overlapped, period_start
        )
        self._hold = False
        self._top_up()
        split = StepSplit(
            sample_s=sampled_at - period_start,
            train_s=time.perf_counter() - sampled_at,
            sample_cpu_s=sampled_cpu - cpu_mark,
            train_cpu_s=time.process_time() - sampled_cpu,
        )
        result.metrics["train/pipeline_sample_seconds"] = split.sample_s
        result.metrics["train/pipeline_train_seconds"] = split.train_s
        result.metrics["train/pipeline_sample_cpu_seconds"] = split.sample_cpu_s
        result.metrics["train/pipeline_train_cpu_seconds"] = split.train_cpu_s
        self._observe(overlapped, result.metrics["train/pipeline_step_seconds"], split)
        return result

    async def _train_batch(
        self,
        batch: list[_Sampled],
        current: int,
        dropped: dict[str, int],
        queue: asyncio.Queue[_Sampled | None],
        started: float,
        overlapped: bool,
        period_start: float,
    ) -> TrainResult:
        ages = [current - item.oldest_step for item in batch]
        elapsed = max(time.perf_counter() - started, 1e-9)
        report = {
            "pipeline_overlap": float(overlapped),
            # Waiting for the batch: the sampling the step did not hide.
            "pipeline_batch_wait_seconds": time.perf_counter() - period_start,
            "pipeline_policy_age_mean": sum(ages) / len(ages),
            "pipeline_policy_age_max": float(max(ages)),
            "pipeline_dropped_stale": float(dropped["stale"]),
            "pipeline_dropped_no_signal": float(dropped["no_signal"]),
            "pipeline_queue_depth": float(queue.qsize()),
            "pipeline_samples_per_second": self._sampled / elapsed,
        }
        groups = []
        for item in batch:
            group = item.group.model_copy(deep=False)
            group.metrics = {**group.metrics, **report}
            groups.append(group)
        result = await self._backend().train(
            self.model, groups, self.train_config, serve_while_training=overlapped
        )
        result.metrics["train/pipeline_step_seconds"] = time.perf_counter() - period_start
        for item in batch:
            self.state.mark_done(item.scenario_index)
        self.state.groups_trained += len(batch)
        self.state.steps += 1
        await asyncio.to_thread(self._save_state)
        return result

    async def _evaluate(self, step: int) -> None:
        assert self.eval_fn is not None
        extra = (self.config,) if _arity(self.eval_fn) >= 3 else ()
        outcome = self.eval_fn(self.model, step, *extra)
        if inspect.isawaitable(outcome):
            outcome = await outcome
        splits = outcome if isinstance(outcome, Mapping) else {"val": outcome}
        for split, items in splits.items():
            items = list(items)
            if items:
                await self.model.log(items, split=split)


def _art_call_shape(
    args: tuple[Any, ...],
    backend: Backend | None,
    rollout_fn: RolloutFn | None,
    scenarios: Iterable[Any] | AsyncIterator[Any] | None,
    config: Any,
    eval_fn: EvalFn | None,
) -> tuple[Backend | None, RolloutFn, Iterable[Any] | AsyncIterator[Any], Any, EvalFn | None]:
    """``PipelineTrainer``'s positional arguments after the model, in either call shape
    (ours, or ART's with the backend first), merged with the keywords."""
    positional = list(args)
    if positional and isinstance(positional[0], Backend):  # ART: (model, backend, ...)
        backend = positional.pop(0)
    names = ["rollout_fn", "scenarios", "config", "eval_fn"]
    if len(positional) > len(names):
        raise TypeError(f"PipelineTrainer takes at most {len(names) + 2} positional arguments")
    given = dict(zip(names, positional, strict=False))
    rollout_fn = given.get("rollout_fn", rollout_fn)
    scenarios = given.get("scenarios", scenarios)
    config = given.get("config", config)
    eval_fn = given.get("eval_fn", eval_fn)
    if rollout_fn is None or scenarios is None:
        raise TypeError("PipelineTrainer needs a rollout_fn and scenarios")
    return backend, rollout_fn, scenarios, config, eval_fn


def _checked_batch(
    *,
    group_size: int | None,
    groups_per_step: int | None,
    min_batch_size: int | None,
    max_steps_off_policy: int,
    eval_every_n_steps: int,
    max_groups_without_signal: int | None,
    max_steps: int | None,
) -> int:
    """``PipelineTrainer``'s size checks; returns the groups per step (default 4)."""
    if groups_per_step is not None and min_batch_size is not None:
        raise TypeError("give groups_per_step or ART's min_batch_size, not both")
    batch = groups_per_step or min_batch_size or 4
    for name, value, low in (
        ("groups_per_step", batch, 1),
        ("max_steps_off_policy", max_steps_off_policy, 0),
        ("eval_every_n_steps", eval_every_n_steps, 0),
        (
            "max_groups_without_signal",
            1 if max_groups_without_signal is None else max_groups_without_signal,
            1,
        ),
    ):
        if value < low:
            raise ValueError(f"{name} must be >= {low}, got {value}")
    if group_size is not None and group_size < 2:
        raise ValueError(f"group_size must be >= 2 (GRPO compares runs), got {group_size}")
    if max_steps is not None and max_steps < 0:
        raise ValueError(f"max_steps must be >= 0, got {max_steps}")
    return batch


def _arity(fn: Callable[..., Any]) -> int:
    """How many positional arguments ``fn`` takes (varargs count as many)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 2
    kinds = [p.kind for p in parameters]
    if inspect.Parameter.VAR_POSITIONAL in kinds:
        return 99
    return sum(
        k in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        for k in kinds
    )


def _postfix(metrics: dict[str, float]) -> dict[str, str]:
    def get(name: str) -> float:
        value = metrics.get(f"train/{name}", math.nan)
        return value if value is not None else math.nan

    return {
        "reward": f"{get('reward'):.3f}",
        "age": f"{get('pipeline_policy_age_mean'):.1f}",
        "queue": f"{get('pipeline_queue_depth'):.0f}",
        "samples/s": f"{get('pipeline_samples_per_second'):.1f}",
        "train tok/s": f"{get('tokens_per_second'):.0f}",
    }
