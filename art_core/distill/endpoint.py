"""``EndpointTeacher``: a teacher behind any OpenAI-compatible server that scores prompts.

Each ``TokenSequence`` goes to the server whole, as a token-id prompt of ``POST
{base_url}/completions`` asking for vLLM's ``prompt_logprobs``: per prompt token its logprob
given the tokens before it, its rank and the ``top_k`` most likely tokens
(``engines/prompt_logprobs.py`` reads the format). A vLLM server speaks it, and so does this
project's gateway (``art-core serve`` or a ``LocalBackend``'s ``/v1``), so a model trained
here can teach another. The teacher must share the student's tokenizer: the ids are the
student's.

The request, per sequence::

    {"model": MODEL, "prompt": [ids...], "max_tokens": 1, "prompt_logprobs": TOP_K,
     "temperature": 1.0}

``max_tokens`` is 1 because vLLM samples at least one token (only ``echo`` may ask for 0), so
a sequence must be shorter than the teacher's context; ``temperature`` 1 because older vLLM
versions scored prompts after the temperature (newer ones score raw logits either way).

Every answer is checked before it is used: a broken or hostile server (a missing field, an
entry short, a position without the scored token, a NaN or positive logprob, a key that is
no token id, ranks missing or repeated, an answer over its size bound) gives a ``ValueError``
naming the sequence and the problem; a server that refuses or fails (after retries) a
``TeacherError``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Self

import httpx
import orjson

from art_core.clients import shared_ssl_context
from art_core.distill.scores import MAX_TOP_K, TeacherScores, trained_positions
from art_core.engines.prompt_logprobs import from_wire

if TYPE_CHECKING:
    from art_core.training.sequences import TokenSequence

logger = logging.getLogger(__name__)

# An answer may take this many bytes per prompt token and alternative (an entry is ~70 bytes
# of JSON plus its decoded token's text), plus a fixed allowance: a server cannot make the
# teacher read (or parse) more than its question warrants.
MAX_ENTRY_BYTES = 512
BASE_ANSWER_BYTES = 1 << 20
# Concurrent requests one teacher may keep open.
MAX_CONCURRENCY = 64


class TeacherError(RuntimeError):
    """The teacher's server refused a sequence (4xx) or kept failing (5xx, connection
    errors) after the retries."""


class _Transient(Exception):
    """A failure worth another try: the server's 5xx or a broken connection."""


class EndpointTeacher:
    """A teacher served over HTTP by a server returning vLLM's ``prompt_logprobs``.

    ``base_url`` ends in ``/v1`` (e.g. ``http://127.0.0.1:8000/v1``); ``model`` is the
    served model's name (a vLLM LoRA name, or ``NAME@STEP`` at this project's gateway);
    ``api_key`` is sent as a bearer token. Up to ``max_concurrency`` sequences are in flight
    at once, each waiting at most ``timeout_s`` per try; a 5xx answer or a broken connection
    is tried again up to ``max_attempts`` times in all, ``retry_delay_s`` doubling between
    tries. Synchronous: the trainer calls ``score`` from its worker thread.

    Example:
        >>> from art_core.training.sequences import TokenSequence
        >>> teacher = EndpointTeacher("http://127.0.0.1:8000/v1", "Qwen/Qwen3-8B")
        >>> seq = TokenSequence([5, 6, 7], [False, True, True], [0.0, -1.2, -0.4])
        >>> [scores] = teacher.score([seq], top_k=2)  # needs a network service: a vLLM server at that address  # doctest: +SKIP
        >>> len(scores.token_logprobs), len(scores.top_ids[0])  # needs a network service  # doctest: +SKIP
        (2, 2)
        >>> teacher.close()
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        max_concurrency: int = 4,
        max_attempts: int = 3,
        retry_delay_s: float = 0.5,
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
        if not isinstance(model, str) or not model:
            raise ValueError("model must be a non-empty string")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if not _is_int(max_concurrency) or not 1 <= max_concurrency <= MAX_CONCURRENCY:
            raise ValueError(
                f"max_concurrency must be in 1..{MAX_CONCURRENCY}, got {max_concurrency!r}"
            )
        if not _is_int(max_attempts) or max_attempts < 1:
            raise ValueError(f"max_attempts must be an int >= 1, got {max_attempts!r}")
        if not retry_delay_s >= 0:
            raise ValueError(f"retry_delay_s must be >= 0, got {retry_delay_s}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.max_attempts = max_attempts
        self.retry_delay_s = retry_delay_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 30.0)),
            limits=httpx.Limits(
                max_connections=max_concurrency, max_keepalive_connections=max_concurrency
            ),
            verify=shared_ssl_context(),
        )
        self._pool = ThreadPoolExecutor(
            max_workers=max_concurrency, thread_name_prefix="art-endpoint-teacher"
        )
        self._lock = threading.Lock()
        self._closed = False

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def score(self, sequences: Sequence[TokenSequence], top_k: int) -> list[TeacherScores]:
        """One ``TeacherScores`` per sequence, in order: at each trained token (in the order
        the tokens appear) the teacher's logprob of it and its ``top_k`` most likely tokens
        (ranks 1..``top_k``, most likely first). The first failure is raised (naming its
        sequence) and the sequences not started yet are not sent.
        """
        if not _is_int(top_k) or not 0 <= top_k <= MAX_TOP_K:
            raise ValueError(f"top_k must be an int in 0..{MAX_TOP_K}, got {top_k!r}")
        with self._lock:
            if self._closed:
                raise RuntimeError("this EndpointTeacher is closed")
            futures: list[Future[TeacherScores]] = [
                self._pool.submit(self._score_one, index, sequence, top_k)
                for index, sequence in enumerate(sequences)
            ]
        try:
            return [future.result() for future in futures]
        finally:
            for future in futures:
                future.cancel()  # after a failure: the ones not started yet stay unsent

    def close(self) -> None:
        """Stop the worker threads (sequences not started are dropped) and close the
        connections; ``score`` raises afterwards. Closing twice is harmless."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._client.close()

    # ----------------------------------------------------------------------------- one sequence
    def _score_one(self, index: int, sequence: TokenSequence, top_k: int) -> TeacherScores:
        positions = trained_positions(sequence)
        if not positions:  # nothing to score: no request
            return TeacherScores([], [], [])
        ids = list(sequence.token_ids)
        body = {
            "model": self.model,
            "prompt": ids,
            "max_tokens": 1,
            "prompt_logprobs": top_k,
            "temperature": 1.0,
        }
        limit = BASE_ANSWER_BYTES + len(ids) * (top_k + 2) * MAX_ENTRY_BYTES
        raw = self._post(index, body, limit)
        try:
            scores = _read_answer(raw, ids, positions, top_k)
            scores.check(num_trained=len(positions), top_k=top_k)
        except ValueError as exc:
            raise ValueError(
                f"the teacher at {self.base_url} answered sequence {index} badly: {exc}"
            ) from None
        return scores

    def _post(self, index: int, body: dict[str, Any], limit: int) -> bytes:
        """The answer's bytes (at most ``limit``), retrying 5xx answers and broken
        connections; ``TeacherError`` when refused or when every try failed."""
        url = f"{self.base_url}/completions"
        delay = self.retry_delay_s
        for attempt in range(1, self.max_attempts + 1):
            try:
                return self._post_once(url, body, limit, index)
            except (_Transient, httpx.TransportError) as exc:
                reason = str(exc) if isinstance(exc, _Transient) else f"{type(exc).__name__}: {exc}"
                if attempt == self.max_attempts:
                    raise TeacherError(
                        f"the teacher at {url} failed sequence {index} {attempt} times; "
                        f"last: {reason}"
                    ) from None
                logger.warning(
                    "teacher try %d/%d for sequence %d failed (%s); retrying in %.1fs",
                    attempt,
                    self.max_attempts,
                    index,
                    reason,
                    delay,
                )
                time.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    def _post_once(self, url: str, body: dict[str, Any], limit: int, index: int) -> bytes:
        with self._client.stream("POST", url, json=body) as response:
            status = response.status_code
            if status >= 400:
                text = _head(response, 2000)
                if status >= 500:
                    raise _Transient(f"HTTP {status}: {text}")
                raise TeacherError(
                    f"the teacher at {url} refused sequence {index} (HTTP {status}): {text}"
                )
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > limit:
                raise ValueError(
                    f"the teacher at {url} answered sequence {index} with {declared} bytes, "
                    f"over the {limit} bytes its {len(body['prompt'])} tokens warrant"
                )
            chunks, size = [], 0
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > limit:
                    raise ValueError(
                        f"the teacher at {url} answered sequence {index} with over {limit} "
                        f"bytes, more than its {len(body['prompt'])} tokens warrant"
                    )
                chunks.append(chunk)
        return b"".join(chunks)


def _read_answer(raw: bytes, ids: list[int], positions: list[int], top_k: int) -> TeacherScores:
    """The scores at ``positions`` in a completions answer; ``ValueError`` naming what is
    wrong with it."""
    try:
        answer = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"the answer is not JSON ({exc})") from None
    if not isinstance(answer, dict):
        raise ValueError("the answer is not a JSON object")
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ValueError("the answer has no choices")
    choice = choices[0]
    # Where the server says which ids it scored (vLLM with return_token_ids, this project's
    # gateway always), they must be the ids sent.
    for echoed in (choice.get("prompt_token_ids"), answer.get("prompt_token_ids")):
        if echoed is not None and echoed != ids:
            raise ValueError("the server scored other prompt token ids than were sent")
    if choice.get("prompt_logprobs") is None:
        raise ValueError(
            "the answer has no prompt_logprobs: does the server score prompts (vLLM's "
            "prompt_logprobs)?"
        )
    scored = from_wire(choice["prompt_logprobs"], ids, top_k)
    token_logprobs, top_ids, top_logprobs = [], [], []
    for position in positions:
        entry = scored[position]
        assert entry is not None  # position 0 is never trained (TokenSequence checks)
        token_logprobs.append(entry.logprob)
        top_ids.append([token for token, _ in entry.top])
        top_logprobs.append([logprob for _, logprob in entry.top])
    return TeacherScores(token_logprobs, top_ids, top_logprobs)


def _head(response: httpx.Response, limit: int) -> str:
    """The start of an error answer's text (read no further than ``limit`` bytes)."""
    data = b""
    for chunk in response.iter_bytes():
        data += chunk
        if len(data) >= limit:
            break
    return data[:limit].decode("utf-8", errors="replace")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
