"""A stand-in RULER judge: a real OpenAI-compatible HTTP server on loopback, no model.

Tests and benchmarks point RULER (or anything that speaks chat completions) at it. It reads
the ``<run id="N">`` blocks of the prompt it receives, scores each run with a deterministic
rule, records every request, and can be scripted to misbehave (reply with prose, the wrong
number of scores, out-of-range scores, unknown ids, HTTP errors, or too slowly).

The default rule: a run's score is the last ``score-hint: X`` written in it (so a test
decides the scores through the runs' own text), else ``min(1, characters / 1000)``.

Example:
    >>> from art_core.rewards.ruler import ruler
    >>> ask = {"role": "user", "content": "Count to 3."}
    >>> runs = [[ask, {"role": "assistant", "content": "1, 2, 3 score-hint: 0.9"}],
    ...         [ask, {"role": "assistant", "content": "1, 2 score-hint: 0.2"}]]
    >>> with StandInJudge() as judge:
    ...     scores = asyncio.run(ruler(runs, "judge", judge_base_url=judge.base_url))
    ...     len(judge.requests)
    1
    >>> [s.score for s in scores]
    [0.9, 0.2]
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from art_core.testing.loopback import LoopbackServer

RUN_RE = re.compile(r'<run id="([^"]+)">\n(.*?)\n</run>', re.DOTALL)
HINT_RE = re.compile(r"score-hint:\s*([0-9]*\.?[0-9]+)")

# What the judge does with the next request (consumed in order from `StandInJudge.script`):
#   "ok"            valid JSON scores (the default when the script is empty)
#   "fenced"        the same JSON inside prose and a ```json fence
#   "not_json"      prose only
#   "wrong_count"   one score too few
#   "out_of_range"  the first score is 1.5
#   "unknown_id"    the first run id is replaced by "99"
#   "slow"          valid scores after `slow_s` seconds (longer than a client timeout)
#   "schema_400"    HTTP 400 if the request has response_format, else "ok"
#   "http_401"      HTTP 401;  "http_500": HTTP 500
#   a callable      takes the request body, returns the reply's content string
Behavior = str | Callable[[dict[str, Any]], str]
Rule = Callable[[str, str], tuple[float, str]]


def hint_rule(run_id: str, text: str) -> tuple[float, str]:
    """Score a run from its text: the last ``score-hint: X``, else its length over 1000.

    Example:
        >>> hint_rule("1", "[assistant]\\nDone. score-hint: 0.8")
        (0.8, 'run 1: 0 tool calls, 0 tool results, hint 0.8')
    """
    hints = HINT_RE.findall(text)
    score = min(1.0, float(hints[-1])) if hints else round(min(1.0, len(text) / 1000), 3)
    calls = text.count("[tool call #")
    results = text.count("[tool result ")
    hint = hints[-1] if hints else "none"
    return score, f"run {run_id}: {calls} tool calls, {results} tool results, hint {hint}"


def count_words(text: str) -> int:
    """The default token count: whitespace-separated words."""
    return len(text.split())


class StandInJudge(LoopbackServer):
    """An OpenAI-compatible judge server on ``127.0.0.1`` (a free port) in a daemon thread.

    ``requests`` holds each request body received, ``headers`` their headers (lower-cased),
    ``urls`` their paths with the query; ``script`` is a queue of behaviors for the next
    requests. ``reverse=True`` lists the scores in reverse run order, to check that callers
    match scores by id, not position. Besides ``/v1/chat/completions`` it answers Azure
    OpenAI's paths (``/openai/deployments/NAME/chat/completions``, ``/openai/v1/...``).
    """

    def __init__(
        self,
        *,
        rule: Rule = hint_rule,
        count_tokens: Callable[[str], int] = count_words,
        reverse: bool = False,
        slow_s: float = 3.0,
    ) -> None:
        super().__init__()
        self.rule = rule
        self.count_tokens = count_tokens
        self.reverse = reverse
        self.slow_s = slow_s
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.urls: list[str] = []
        self.script: list[Behavior] = []
        self._lock = threading.Lock()

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, e.g. ``http://127.0.0.1:51234/v1``."""
        return f"{self.url}/v1"

    def reset(self) -> None:
        """Forget the recorded requests and the script."""
        with self._lock:
            self.requests.clear()
            self.headers.clear()
            self.urls.clear()
            self.script.clear()

    def routes(self) -> list[Route]:
        return [
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
            # Azure OpenAI: a deployment's endpoint (with ?api-version=), and the v1 API
            Route(
                "/openai/deployments/{deployment}/chat/completions", self._chat, methods=["POST"]
            ),
            Route("/openai/v1/chat/completions", self._chat, methods=["POST"]),
        ]

    # -- HTTP handlers -------------------------------------------------------------------

    async def _models(self, request: Request) -> JSONResponse:
        return JSONResponse(
            {"object": "list", "data": [{"id": "stand-in-judge", "object": "model"}]}
        )

    async def _chat(self, request: Request) -> JSONResponse:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "request body is not JSON")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return _error(400, "`messages` must be a list")
        if not isinstance(body.get("model"), str):
            return _error(400, "`model` must be a string")
        with self._lock:
            self.requests.append(body)
            self.headers.append({k.lower(): v for k, v in request.headers.items()})
            query = request.url.query
            self.urls.append(request.url.path + (f"?{query}" if query else ""))
            behavior: Behavior = self.script.pop(0) if self.script else "ok"

        if behavior == "http_401":
            return _error(401, "invalid API key")
        if behavior == "http_500":
            return _error(500, "the judge crashed")
        if behavior == "schema_400":
            if "response_format" in body:
                return _error(400, "response_format is not supported")
            behavior = "ok"
        if behavior == "slow":
            waited = 0.0
            while waited < self.slow_s and not self.stopping.is_set():
                await asyncio.sleep(0.05)
                waited += 0.05
            behavior = "ok"
        content = behavior(body) if callable(behavior) else self._content(body, behavior)
        prompt_text = "\n".join(str(m.get("content", "")) for m in body["messages"])
        prompt_tokens = self.count_tokens(prompt_text)
        completion_tokens = self.count_tokens(content)
        return JSONResponse(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": "stop",
                        "logprobs": None,
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
            }
        )

    def _content(self, body: dict[str, Any], behavior: str) -> str:
        prompt = "\n".join(str(m.get("content", "")) for m in body["messages"])
        entries = []
        for run_id, text in RUN_RE.findall(prompt):
            score, explanation = self.rule(run_id, text)
            entries.append({"run_id": run_id, "explanation": explanation, "score": score})
        if self.reverse:
            entries.reverse()
        if behavior == "not_json":
            return "Run 1 looks best to me; the others made mistakes."
        if behavior == "wrong_count":
            entries = entries[:-1]
        elif behavior == "out_of_range" and entries:
            entries[0]["score"] = 1.5
        elif behavior == "unknown_id" and entries:
            entries[0]["run_id"] = "99"
        reply = json.dumps({"scores": entries})
        if behavior == "fenced":
            return f"Here are my scores.\n\n```json\n{reply}\n```\nLet me know if you need more."
        if behavior not in ("ok", "wrong_count", "out_of_range", "unknown_id"):
            raise ValueError(f"unknown stand-in judge behavior {behavior!r}")
        return reply


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": "invalid_request_error", "code": status}},
        status_code=status,
    )
