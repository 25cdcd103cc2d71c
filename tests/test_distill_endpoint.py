"""``EndpointTeacher`` against the project's own gateway (scores equal the model's own
log-softmax at the trained tokens) and against a stand-in server on loopback whose broken or
hostile answers each fail with an error naming the sequence and the problem.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
import torch
from prompt_logprobs_support import reference, tolerance
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

import art_core as art
from art_core.distill.endpoint import EndpointTeacher, TeacherError
from art_core.distill.scores import TeacherScores, trained_positions
from art_core.testing.loopback import LoopbackServer
from art_core.training.sequences import TokenSequence


def _sequence(ids: list[int], first_trained: int) -> TokenSequence:
    mask = [i >= first_trained for i in range(len(ids))]
    return TokenSequence(ids, mask, [-1.0 if m else 0.0 for m in mask])


async def test_gateway_scores_equal_the_models_own(tiny_model: art.TrainableModel) -> None:
    backend: Any = tiny_model.backend()
    engine = backend.engine(tiny_model)
    sequences = [
        _sequence([5, 17, 250, 3, 99, 42, 42, 7, 600, 12], first_trained=4),
        _sequence([9, 8, 7, 6, 5, 4, 3, 2, 1, 300, 301, 302, 303], first_trained=2),
        _sequence([11, 12, 13], first_trained=3),  # nothing trained: no request at all
    ]
    assert tiny_model.inference_base_url is not None
    tol = tolerance(engine.dtype)
    for top_k in (0, 3):
        with EndpointTeacher(
            tiny_model.inference_base_url,
            tiny_model.name,
            api_key=tiny_model.inference_api_key,
            max_concurrency=2,
        ) as teacher:
            scores = await asyncio.to_thread(teacher.score, sequences, top_k)
        assert len(scores) == 3 and scores[2] == TeacherScores([], [], [])
        for sequence, score in zip(sequences[:2], scores[:2], strict=True):
            ref = reference(engine.model_path, engine.dtype, sequence.token_ids)
            positions = trained_positions(sequence)
            score.check(num_trained=len(positions), top_k=top_k, vocab_size=ref.shape[-1])
            for j, position in enumerate(positions):
                row = ref[position - 1]
                own = float(row[sequence.token_ids[position]])
                assert score.token_logprobs[j] == pytest.approx(own, abs=tol)
                best = torch.topk(row, top_k).values.tolist()
                assert score.top_logprobs[j] == pytest.approx(best, abs=tol)
                assert [float(row[i]) for i in score.top_ids[j]] == pytest.approx(
                    score.top_logprobs[j], abs=tol
                )


# ----------------------------------------------------------------------------- the stand-in
BROKEN = 999  # a prompt starting with this id gets the stand-in's damage


def good_answer(ids: list[int], k: int) -> dict[str, Any]:
    """Made-up but consistent scores: ids 0..k-1 are the top k (rank r: logprob -r/4); a
    prompt token outside them has logprob -6 - position/100 and rank k + 1 + position."""
    entries: list[dict[str, Any] | None] = [None]
    for position in range(1, len(ids)):
        token = ids[position]
        own = (
            {"logprob": -(token + 1) / 4, "rank": token + 1, "decoded_token": "t"}
            if token < k
            else {"logprob": -6 - position / 100, "rank": k + 1 + position, "decoded_token": "x"}
        )
        position_entries = {str(token): own}
        for rank in range(1, k + 1):
            position_entries[str(rank - 1)] = {"logprob": -rank / 4, "rank": rank}
        entries.append(position_entries)
    return {
        "object": "text_completion",
        "choices": [{"index": 0, "text": "a", "prompt_logprobs": entries}],
        "prompt_token_ids": ids,
    }


Damage = Callable[[dict[str, Any]], Any]


class StandInTeacher(LoopbackServer):
    """``/v1/completions`` answering ``good_answer``; a prompt starting with ``BROKEN`` gets
    ``damage(answer)`` instead (a dict: sent as JSON; bytes or a Response: sent as they are);
    the first ``fail_first`` requests get a 503."""

    def __init__(self) -> None:
        super().__init__()
        self.damage: Damage | None = None
        self.fail_first = 0
        self.bodies: list[dict[str, Any]] = []
        self.auth: list[str | None] = []
        self.in_flight = 0
        self.most_in_flight = 0

    def routes(self) -> list[Route]:
        return [Route("/v1/completions", self.completions, methods=["POST"])]

    async def completions(self, request: Request) -> Response:
        body = await request.json()
        self.bodies.append(body)
        self.auth.append(request.headers.get("authorization"))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.01)  # hold the request open: concurrent ones overlap
        finally:
            self.in_flight -= 1
        if self.fail_first > 0:
            self.fail_first -= 1
            return JSONResponse({"error": {"message": "overloaded"}}, status_code=503)
        answer = good_answer(body["prompt"], body["prompt_logprobs"])
        if body["prompt"][0] != BROKEN or self.damage is None:
            return JSONResponse(answer)
        damaged = self.damage(answer)
        if isinstance(damaged, Response):
            return damaged
        if isinstance(damaged, bytes):
            return Response(damaged, media_type="application/json")
        return Response(json.dumps(damaged), media_type="application/json")  # NaN as NaN


@pytest.fixture(scope="module")
def stand_in() -> Any:
    with StandInTeacher() as server:
        yield server


@pytest.fixture
def server(stand_in: StandInTeacher) -> StandInTeacher:
    stand_in.damage, stand_in.fail_first = None, 0
    stand_in.bodies.clear()
    stand_in.auth.clear()
    stand_in.most_in_flight = 0
    return stand_in


GOOD = _sequence([1, 2, 50, 51, 52], first_trained=2)
# Position 3 holds token 0 (one of the top k), position 4 token 70 (outside them).
BAD = _sequence([BROKEN, 60, 61, 0, 70], first_trained=1)
K = 3


def _teacher(server: StandInTeacher, **kwargs: Any) -> EndpointTeacher:
    return EndpointTeacher(f"{server.url}/v1", "teacher", retry_delay_s=0, **kwargs)


def test_good_answers_are_read_at_the_trained_tokens(server: StandInTeacher) -> None:
    with _teacher(server, api_key="sk-test", max_concurrency=2) as teacher:
        scores = teacher.score([GOOD, BAD, GOOD, BAD, GOOD], top_k=K)
    assert server.most_in_flight <= 2
    assert server.auth == ["Bearer sk-test"] * 5
    # Two requests are in flight at once, so the server sees them in any order.
    assert sorted(server.bodies, key=lambda body: body["prompt"]) == sorted(
        (
            {
                "model": "teacher",
                "prompt": sequence.token_ids,
                "max_tokens": 1,
                "prompt_logprobs": K,
                "temperature": 1.0,
            }
            for sequence in [GOOD, BAD, GOOD, BAD, GOOD]
        ),
        key=lambda body: body["prompt"],
    )
    top_ids, top_logprobs = [0, 1, 2], [-0.25, -0.5, -0.75]
    assert scores[0] == TeacherScores(
        token_logprobs=[-6.02, -6.03, -6.04],
        top_ids=[top_ids] * 3,
        top_logprobs=[top_logprobs] * 3,
    )
    assert scores[1].token_logprobs == [-6.01, -6.02, -0.25, -6.04]  # token 0 is rank 1
    assert scores[1].top_ids == [top_ids] * 4


def _position(answer: dict[str, Any], position: int) -> dict[str, Any]:
    return answer["choices"][0]["prompt_logprobs"][position]


def _set(answer: dict[str, Any], position: int, token: str, **fields: Any) -> dict[str, Any]:
    _position(answer, position)[token].update(fields)
    return answer


def _without(answer: dict[str, Any], position: int, token: str, field: str | None = None) -> Any:
    if field is None:
        del _position(answer, position)[token]
    else:
        del _position(answer, position)[token][field]
    return answer


def _rekey(answer: dict[str, Any], position: int, old: str, new: str) -> dict[str, Any]:
    entries = _position(answer, position)
    entries[new] = entries.pop(old)
    return answer


def _swap_top(answer: dict[str, Any]) -> dict[str, Any]:
    entries = _position(answer, 2)
    entries["0"]["logprob"], entries["1"]["logprob"] = -0.5, -0.25
    return answer


def _pl(answer: dict[str, Any]) -> list[Any]:
    return answer["choices"][0]["prompt_logprobs"]


OVERSIZE = b" " * (3 << 20)

DAMAGES: list[tuple[str, Damage, str]] = [
    ("not JSON", lambda a: b"{nope", "not JSON"),
    ("not an object", lambda a: [a], "not a JSON object"),
    ("no choices", lambda a: {**a, "choices": []}, "no choices"),
    ("no prompt_logprobs", lambda a: {**a, "choices": [{"index": 0}]}, "no prompt_logprobs"),
    ("not a list", lambda a: {**a, "choices": [{"prompt_logprobs": {}}]}, "dict, not a list"),
    ("one entry short", lambda a: (_pl(a).pop(), a)[1], "4 entries for a prompt of 5"),
    ("one entry more", lambda a: (_pl(a).append(None), a)[1], "6 entries for a prompt of 5"),
    ("a position null", lambda a: (_pl(a).__setitem__(2, None), a)[1], r"\[2\]: is null"),
    ("the prompt token missing", lambda a: _without(a, 4, "70"), "prompt token 70 is missing"),
    ("a NaN logprob", lambda a: _set(a, 2, "61", logprob=float("nan")), "not JSON"),
    ("an infinite logprob", lambda a: _set(a, 2, "61", logprob=float("-inf")), "not JSON"),
    ("a logprob as text", lambda a: _set(a, 2, "61", logprob="NaN"), "logprob is str"),
    ("a positive logprob", lambda a: _set(a, 2, "61", logprob=0.5), "not finite and <= 0"),
    ("a key that is no id", lambda a: _rekey(a, 2, "1", "abc"), "'abc' is not a token id"),
    ("a vLLM text key", lambda a: _rekey(a, 2, "1", "token_id:1"), "is not a token id"),
    ("a negative key", lambda a: _rekey(a, 2, "1", "-1"), "'-1' is not a token id"),
    ("a rank missing", lambda a: _without(a, 2, "1", "rank"), "rank is None"),
    ("a rank of 0", lambda a: _set(a, 2, "1", rank=0), "rank is 0"),
    ("a rank as text", lambda a: _set(a, 2, "1", rank="2"), "rank is '2'"),
    ("two tokens of rank 1", lambda a: _set(a, 2, "61", rank=1), "both have rank 1"),
    ("a top rank missing", lambda a: _set(a, 2, "2", rank=9), "2 tokens have ranks 1..3"),
    ("more entries than asked", lambda a: _extra_entry(a), "holds 5 tokens; at most 4"),
    ("the top out of order", _swap_top, "likelier than a token ranked before it"),
    ("an unranked token likelier", lambda a: _set(a, 2, "61", logprob=-0.1), "rank-3 token"),
    ("other ids scored", lambda a: {**a, "prompt_token_ids": [1, 2]}, "other prompt token ids"),
    ("an answer too large", lambda a: OVERSIZE, "3145728 bytes, over the"),
    (
        "a streamed answer too large",
        lambda a: StreamingResponse(iter([OVERSIZE[: 1 << 20]] * 3)),
        "with over .* bytes",
    ),
]


def _extra_entry(answer: dict[str, Any]) -> dict[str, Any]:
    _position(answer, 2)["77"] = {"logprob": -9.0, "rank": 50}
    return answer


@pytest.mark.parametrize(
    ("damage", "needle"), [(d, n) for _, d, n in DAMAGES], ids=[i for i, _, _ in DAMAGES]
)
def test_broken_answers_fail_naming_the_sequence(
    server: StandInTeacher, damage: Damage, needle: str
) -> None:
    server.damage = damage
    with _teacher(server, max_concurrency=1) as teacher:
        with pytest.raises(ValueError, match="sequence 1") as failure:
            teacher.score([GOOD, BAD, GOOD], top_k=K)
    assert failure.match(needle)


def test_server_errors_are_retried(server: StandInTeacher) -> None:
    server.fail_first = 2
    with _teacher(server) as teacher:
        [score] = teacher.score([GOOD], top_k=K)
    assert len(server.bodies) == 3  # two 503s, then the answer
    assert score.token_logprobs == [-6.02, -6.03, -6.04]


def test_a_server_that_keeps_failing_is_given_up(server: StandInTeacher) -> None:
    server.fail_first = 10
    with _teacher(server, max_attempts=2) as teacher:
        with pytest.raises(TeacherError, match=r"failed sequence 0 2 times; last: HTTP 503"):
            teacher.score([GOOD], top_k=K)
    assert len(server.bodies) == 2


def test_a_refusal_is_not_retried(server: StandInTeacher) -> None:
    server.damage = lambda a: JSONResponse({"error": {"message": "no model"}}, status_code=404)
    with _teacher(server) as teacher:
        with pytest.raises(TeacherError, match=r"refused sequence 0 \(HTTP 404\): .*no model"):
            teacher.score([BAD], top_k=K)
    assert len(server.bodies) == 1


def test_no_server_is_a_clear_error() -> None:
    from art_core.engines.process import free_port

    teacher = EndpointTeacher(
        f"http://127.0.0.1:{free_port()}/v1", "teacher", max_attempts=2, retry_delay_s=0
    )
    with pytest.raises(TeacherError, match="failed sequence 0 2 times; last: ConnectError"):
        teacher.score([GOOD], top_k=0)
    teacher.close()
    teacher.close()  # twice is harmless
    with pytest.raises(RuntimeError, match="closed"):
        teacher.score([GOOD], top_k=0)


@pytest.mark.parametrize("top_k", [-1, 21, True, 2.0, "3"])
def test_bad_top_k_is_refused(server: StandInTeacher, top_k: Any) -> None:
    with _teacher(server) as teacher:
        with pytest.raises(ValueError, match="top_k"):
            teacher.score([GOOD], top_k=top_k)
    assert server.bodies == []


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"base_url": "ftp://host/v1"}, "base_url"),
        ({"model": ""}, "model"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"max_concurrency": 65}, "max_concurrency"),
        ({"max_concurrency": True}, "max_concurrency"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"retry_delay_s": -1}, "retry_delay_s"),
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, Any], needle: str) -> None:
    settings: dict[str, Any] = {"base_url": "http://127.0.0.1:1/v1", "model": "m", **kwargs}
    with pytest.raises(ValueError, match=needle):
        EndpointTeacher(settings.pop("base_url"), settings.pop("model"), **settings)
