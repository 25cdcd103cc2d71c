"""RULER when the judge misbehaves: every malformed reply gets exactly one retry, then a
clear error (or None when swallowed), and the group is left exactly as it was."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from art_core.rewards import RulerError, ruler, ruler_score_group
from art_core.testing.judge import StandInJudge
from art_core.trajectories import Trajectory, TrajectoryGroup

SHARED = [{"role": "user", "content": "Name a prime number above 10."}]

# behavior of the stand-in -> words the error must contain
MALFORMED = {
    "not_json": "reply is not JSON",
    "wrong_count": "expected 3 scores, got 2",
    "out_of_range": "is 1.5, outside [0, 1]",
    "unknown_id": "unknown run id '99'",
    "slow": "timeout",
}


@pytest.fixture(scope="module")
def judge_server() -> Iterator[StandInJudge]:
    # replaces the plugin's session judge here: "slow" replies come after 2 s
    with StandInJudge(slow_s=2.0) as server:
        yield server


def make_group() -> TrajectoryGroup:
    answers = [
        ("11 score-hint: 0.9", 1.0),
        ("12 score-hint: 0.1", 0.0),
        ("13 score-hint: 0.8", 1.0),
    ]
    return TrajectoryGroup(
        Trajectory(
            messages_and_choices=[*SHARED, {"role": "assistant", "content": text}],
            reward=reward,
            metrics={"correct": bool(reward)},
            logs=["rollout finished"],
        )
        for text, reward in answers
    )


async def score(judge: StandInJudge, group: TrajectoryGroup, **options):
    return await ruler_score_group(
        group, "judge-1", judge_base_url=judge.base_url, request_timeout=0.5, **options
    )


@pytest.mark.parametrize("behavior", list(MALFORMED))
async def test_malformed_twice_raises_a_clear_error_after_one_retry(judge, behavior):
    judge.script = [behavior, behavior]
    group = make_group()
    before = group.model_dump()

    with pytest.raises(RulerError) as info:
        await score(judge, group)

    assert len(judge.requests) == 2  # the first request and exactly one retry
    message = str(info.value)
    assert "after 2 attempts" in message
    assert message.count(MALFORMED[behavior]) == 2, message
    assert len(info.value.attempts) == 2
    assert group.model_dump() == before  # nothing in the group changed


@pytest.mark.parametrize("behavior", list(MALFORMED))
async def test_malformed_twice_returns_none_when_swallowed(judge, behavior):
    judge.script = [behavior, behavior]
    group = make_group()
    before = group.model_dump()

    assert await score(judge, group, swallow_exceptions=True) is None

    assert len(judge.requests) == 2
    assert group.model_dump() == before


@pytest.mark.parametrize("behavior", list(MALFORMED))
async def test_one_malformed_reply_is_recovered_by_the_retry(judge, behavior):
    judge.script = [behavior]
    group = make_group()

    await score(judge, group)

    assert len(judge.requests) == 2
    assert [t.reward for t in group] == [0.9, 0.1, 0.8]
    assert group.metrics["ruler_judge_calls"] == 2
    # the retry is the same request
    assert judge.requests[0]["messages"] == judge.requests[1]["messages"]


async def test_failed_replies_are_not_cached(judge, tmp_path):
    judge.script = ["out_of_range", "out_of_range"]
    with pytest.raises(RulerError):
        await score(judge, make_group())
    group = make_group()
    await score(judge, group)  # the judge is asked again, and answers well this time
    assert len(judge.requests) == 3
    assert [t.reward for t in group] == [0.9, 0.1, 0.8]


async def test_judge_without_structured_output_gets_a_plain_request(judge):
    judge.script = ["schema_400"]
    group = make_group()
    await score(judge, group)
    assert "response_format" in judge.requests[0]
    assert "response_format" not in judge.requests[1]
    assert [t.reward for t in group] == [0.9, 0.1, 0.8]


async def test_server_error_is_retried_once(judge):
    judge.script = ["http_500", "http_500"]
    with pytest.raises(RulerError, match="HTTP 500"):
        await score(judge, make_group())
    assert len(judge.requests) == 2


async def test_rejected_key_is_not_retried(judge):
    judge.script = ["http_401"]
    group = make_group()
    before = group.model_dump()
    with pytest.raises(RulerError, match=r"HTTP 401.*not retrying"):
        await score(judge, group)
    assert len(judge.requests) == 1
    assert await score(judge, group, swallow_exceptions=True) is not None  # next reply is fine
    judge.script = ["http_401"]
    group = make_group()
    before = group.model_dump()
    assert await score(judge, group, swallow_exceptions=True, cache=False) is None
    assert group.model_dump() == before


async def test_unreachable_judge(judge):
    with pytest.raises(RulerError, match="could not reach the judge"):
        await ruler(
            [[*SHARED, {"role": "assistant", "content": "11"}]],
            "judge-1",
            judge_base_url="http://127.0.0.1:9/v1",  # discard port: nothing listens
        )
