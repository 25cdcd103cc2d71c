"""``LocalTeacher``: a teacher model in this process, scoring the student's sampled tokens.

The teacher is any Hugging Face causal LM (a folder, or an embedded name such as
``tiny-random``), optionally with a PEFT adapter on top (a checkpoint of a model trained here:
``.art/{project}/models/{name}/checkpoints/0003``). It reads each ``TokenSequence`` once and
answers, for every trained token, the teacher's logprob of that token and its ``top_k`` most
likely alternatives (see ``distill.scores``).

Only the logits of the positions that predict a trained token are computed and soft-maxed:
a full-vocabulary ``log_softmax`` over every context position would cost far more memory than
the forward itself on a long agent transcript with a 150k-token vocabulary.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from art_core.device import choose_device, follow_free_cores, serving_dtype, use_cpu_threads
from art_core.distill.scores import MAX_TOP_K, TeacherScores, trained_positions
from art_core.embedded import is_embedded_name, resolve_base_model
from art_core.embedded.gguf import is_gguf_name
from art_core.kept_logits import KeptLogits

if TYPE_CHECKING:
    from art_core.training.sequences import TokenSequence

logger = logging.getLogger(__name__)

# How many fp32 values one log_softmax chunk may hold (64 MiB): bounds the peak memory of
# scoring many trained positions against a large vocabulary.
_SOFTMAX_CHUNK_ELEMENTS = 1 << 24


class LocalTeacher:
    """A teacher model loaded in this process (lazily, on the first ``score``).

    ``model`` is a Hugging Face model folder or an embedded name (resolved with
    ``art_core.embedded.resolve_base_model`` under ``art_path``); ``adapter`` an optional PEFT
    adapter folder applied on top. Weights are fp32 on CPU (teacher logprobs are the training
    target, so they are not rounded to bf16) and ``serving_dtype`` on CUDA, unless ``dtype``
    says otherwise; the softmax is fp32 everywhere. Sequences are run in right-padded batches
    of at most ``max_tokens_per_batch`` tokens (padding included; a longer sequence runs
    alone).

    Example:
        >>> from art_core.training.sequences import TokenSequence
        >>> teacher = LocalTeacher("tiny-random")
        >>> seq = TokenSequence([5, 6, 7], [False, True, True], [0.0, -1.2, -0.4])
        >>> [scores] = teacher.score([seq], top_k=2)
        >>> len(scores.token_logprobs), len(scores.top_ids[0])
        (2, 2)
        >>> teacher.close()
    """

    def __init__(
        self,
        model: str | Path,
        *,
        adapter: str | Path | None = None,
        device: str | torch.device | None = None,
        max_tokens_per_batch: int = 8192,
        dtype: torch.dtype | None = None,
        art_path: str | Path = ".art",
    ) -> None:
        if max_tokens_per_batch < 1:
            raise ValueError(f"max_tokens_per_batch must be >= 1, got {max_tokens_per_batch}")
        self.device = choose_device(device)
        self.dtype: torch.dtype = dtype or (
            serving_dtype(self.device) if self.device.type == "cuda" else torch.float32
        )
        self.max_tokens_per_batch = max_tokens_per_batch
        self._art_path = art_path
        self._model_name = str(model)
        # A folder is checked now (cheap), so a typo fails before any rollout is gathered;
        # embedded names and GGUF files may have to be built, which waits for the first score.
        self._model_path: Path | None = (
            None
            if is_embedded_name(self._model_name) or is_gguf_name(self._model_name)
            else resolve_base_model(self._model_name, art_path)
        )
        self.adapter_path = None if adapter is None else Path(adapter)
        if (
            self.adapter_path is not None
            and not (self.adapter_path / "adapter_config.json").is_file()
        ):
            raise FileNotFoundError(
                f"{self.adapter_path} is not a PEFT adapter folder (no adapter_config.json)"
            )
        self._lock = threading.Lock()
        self._model: Any = None
        self._vocab_size = 0
        # Only the trained positions' logits are computed, where the model allows it.
        self._kept_logits = KeptLogits("the teacher")

    @property
    def model_path(self) -> Path:
        """The teacher's Hugging Face folder (an embedded name is built here when needed)."""
        if self._model_path is None:
            self._model_path = resolve_base_model(self._model_name, self._art_path)
        return self._model_path

    @property
    def vocab_size(self) -> int:
        """The teacher's vocabulary size (loads the model)."""
        with self._lock:
            self._ensure_loaded()
            return self._vocab_size

    def load(self) -> None:
        """Load the model now (else the first ``score`` does).

        Example:
            >>> LocalTeacher("tiny-random").load()
        """
        with self._lock:
            self._ensure_loaded()

    def score(self, sequences: Sequence[TokenSequence], top_k: int) -> list[TeacherScores]:
        """The teacher's logprobs at each sequence's trained tokens, one result per sequence.

        For a trained position ``j``, ``token_logprobs`` holds ``log p(token_ids[j] |
        token_ids[:j])`` at temperature 1 and ``top_ids``/``top_logprobs`` the ``top_k``
        most likely ids at that position, most likely first. Raises ``ValueError`` when
        ``top_k`` is outside 0..``MAX_TOP_K`` or an id is outside the teacher's vocabulary.

        Example:
            >>> from art_core.training.sequences import TokenSequence
            >>> seq = TokenSequence([5, 6, 7], [False, False, True], [0.0, 0.0, -0.3])
            >>> [s] = LocalTeacher("tiny-random").score([seq], top_k=3)
            >>> len(s.token_logprobs), len(s.top_ids[0]), s.top_logprobs[0] == sorted(s.top_logprobs[0], reverse=True)
            (1, 3, True)
        """
        if not 0 <= top_k <= MAX_TOP_K:
            raise ValueError(f"top_k must be in 0..{MAX_TOP_K}, got {top_k}")
        positions = [trained_positions(seq) for seq in sequences]
        with self._lock:
            self._ensure_loaded()
            self._check_ids(sequences)
            if top_k > self._vocab_size:
                raise ValueError(f"top_k {top_k} exceeds the teacher's vocabulary size")
            if self.device.type == "cpu":
                use_cpu_threads()  # this calling thread's count, capped at our cores
            # A sequence with nothing trained needs no forward: its answer is empty.
            results = [TeacherScores([], [], []) for _ in sequences]
            for batch in self._batches(sequences, positions):
                batch_results = self._score_batch(
                    [sequences[i] for i in batch], [positions[i] for i in batch], top_k
                )
                for index, result in zip(batch, batch_results, strict=True):
                    results[index] = result
        for result, trained in zip(results, positions, strict=True):
            result.check(num_trained=len(trained), top_k=top_k, vocab_size=self._vocab_size)
        return results

    def close(self) -> None:
        """Free the model (a later ``score`` loads it again).

        Example:
            >>> teacher = LocalTeacher("tiny-random")
            >>> teacher.score([], top_k=0)  # loads the model
            []
            >>> teacher.close()
        """
        with self._lock:
            if self._model is None:
                return
            self._model = None
            gc.collect()  # the weights are only freed once nothing refers to them
            if self.device.type == "cuda":
                torch.cuda.empty_cache()

    # ------------------------------------------------------------------ internals

    def _ensure_loaded(self) -> None:
        if self._model is not None:
            return
        from transformers import AutoModelForCausalLM

        if self.device.type == "cpu":
            use_cpu_threads()
        path = self.model_path
        logger.info(
            "loading teacher %s%s on %s (%s)",
            path,
            f" + adapter {self.adapter_path}" if self.adapter_path else "",
            self.device,
            self.dtype,
        )
        model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=self.dtype)
        model = model.to(self.device)
        if self.adapter_path is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, self.adapter_path, is_trainable=False)
        model.eval()
        model.requires_grad_(False)
        # The smaller of the two embeddings: an id past either one cannot be scored.
        vocab = int(model.get_input_embeddings().num_embeddings)
        output = model.get_output_embeddings()
        if output is not None and getattr(output, "weight", None) is not None:
            vocab = min(vocab, int(output.weight.shape[0]))
        self._vocab_size = vocab
        self._model = model

    def _check_ids(self, sequences: Sequence[TokenSequence]) -> None:
        for index, seq in enumerate(sequences):
            bad = next((i for i in seq.token_ids if not 0 <= i < self._vocab_size), None)
            if bad is not None:
                raise ValueError(
                    f"sequence {index}: token id {bad} is outside the teacher's vocabulary "
                    f"(size {self._vocab_size}); teacher and student must share a tokenizer"
                )

    def _batches(
        self, sequences: Sequence[TokenSequence], positions: list[list[int]]
    ) -> list[list[int]]:
        """Indices of the sequences to score, grouped into batches of similar lengths.

        A sequence runs up to its last trained token's prefix (later context changes no
        trained logit), so that is its length here; longest first, so each batch's first
        sequence sets its padded length.
        """
        todo = sorted(
            (i for i, trained in enumerate(positions) if trained),
            key=lambda i: -positions[i][-1],
        )
        batches: list[list[int]] = []
        for index in todo:
            if batches:
                longest = positions[batches[-1][0]][-1]
                if (len(batches[-1]) + 1) * longest <= self.max_tokens_per_batch:
                    batches[-1].append(index)
                    continue
            batches.append([index])
        return batches

    def _score_batch(
        self, sequences: list[TokenSequence], positions: list[list[int]], top_k: int
    ) -> list[TeacherScores]:
        device = self.device
        length = max(trained[-1] for trained in positions)
        input_ids = torch.zeros((len(sequences), length), dtype=torch.long)
        attention_mask = torch.zeros((len(sequences), length), dtype=torch.long)
        keep = torch.zeros((len(sequences), length), dtype=torch.bool)
        targets: list[int] = []
        for row, (seq, trained) in enumerate(zip(sequences, positions, strict=True)):
            n = trained[-1]
            input_ids[row, :n] = torch.tensor(seq.token_ids[:n])
            attention_mask[row, :n] = 1
            # Position j's token is predicted by the logits of position j - 1.
            keep[row, [j - 1 for j in trained]] = True
            targets += [seq.token_ids[j] for j in trained]
        inputs: dict[str, Any] = {
            "input_ids": input_ids.to(device),
            "attention_mask": attention_mask.to(device),
            # Right padding: every row's positions start at 0.
            "position_ids": torch.arange(length)[None].expand(len(sequences), -1).to(device),
            "use_cache": False,
        }
        if device.type == "cpu":
            follow_free_cores()  # fewer threads while other processes run
        with torch.inference_mode():
            logits = self._kept_logits(self._model, inputs, keep.to(device))
            token_lp, top_ids, top_lp = _score_rows(
                logits, torch.tensor(targets, device=device), top_k
            )
        # Rows come in (row, position) order: each sequence's trained tokens, in order.
        results: list[TeacherScores] = []
        start = 0
        for trained in positions:
            end = start + len(trained)
            results.append(
                TeacherScores(token_lp[start:end], top_ids[start:end], top_lp[start:end])
            )
            start = end
        return results


def _score_rows(
    logits: torch.Tensor, targets: torch.Tensor, top_k: int
) -> tuple[list[float], list[list[int]], list[list[float]]]:
    """Per row of ``logits``: the fp32 logprob of ``targets[row]`` and the ``top_k`` best ids
    and logprobs, computed in chunks so the fp32 copy of a large vocabulary stays small.

    Example:
        >>> lp, ids, tops = _score_rows(torch.tensor([[0.0, 1.0]]), torch.tensor([0]), 1)
        >>> round(lp[0], 4), ids, [[round(v, 4) for v in row] for row in tops]
        (-1.3133, [[1]], [[-0.3133]])
    """
    rows = max(1, _SOFTMAX_CHUNK_ELEMENTS // max(1, logits.shape[-1]))
    token_lp: list[float] = []
    top_ids: list[list[int]] = []
    top_lp: list[list[float]] = []
    for start in range(0, logits.shape[0], rows):
        logp = logits[start : start + rows].float().log_softmax(-1)
        picked = logp.gather(-1, targets[start : start + rows, None])[:, 0]
        token_lp += picked.cpu().tolist()
        if top_k:
            values, ids = torch.topk(logp, top_k, dim=-1, sorted=True)
            top_ids += ids.cpu().tolist()
            top_lp += values.cpu().tolist()
        else:
            top_ids += [[] for _ in range(len(picked))]
            top_lp += [[] for _ in range(len(picked))]
    return token_lp, top_ids, top_lp


__all__ = ["LocalTeacher"]
