"""``build_ui_app``: the viewer's Starlette app, read-only, over one art folder.

Pages are one HTML shell with the viewer's script and style (served from the package, never a
CDN: it works offline); the script draws each page from the JSON routes under ``/api``. Only
GET and HEAD are routed: nothing a request carries can change a file. Blocking reads run off
the event loop; a missing or damaged record answers a JSON error naming it (404 or 422, in
the server's one error shape, ``{"error": {"message": ...}}``), and the page shows that
message.

Example:
    >>> app = build_ui_app(".art")
    >>> import uvicorn
    >>> uvicorn.run(app, host="127.0.0.1", port=7998)  # starts a server: until Ctrl-C  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import html
import logging
import re
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from art_core.gateway.errors import error_body, error_type, http_exception_response, shown_path
from art_core.ui.curves import curve_csv, metric_curve, recorded_metrics, run_curves
from art_core.ui.findings import run_diagnoses, run_evals
from art_core.ui.folder import ArtFolder, ModelRef, NotFound, read_history, run_summary, step_files
from art_core.ui.rollout import call_details, conversation, read_signal, token_view
from art_core.ui.steps import StepCache
from art_core.ui.table import TableQuery, TableQueryError
from art_core.ui.tokens import find_tokenizer

logger = logging.getLogger(__name__)
T = TypeVar("T")
STATIC = resources.files("art_core.ui") / "static"
# Steps, group numbers and ids taken from a URL, checked before any lookup.
_STEP = re.compile(r"[0-9]{1,9}")
_SPLIT = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}")
_ID = re.compile(r"[A-Za-z0-9._:-]{1,200}")
_SECURITY_HEADERS = {
    # Everything comes from this server: no inline script, no CDN, no framing.
    "content-security-policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}


class BadRequest(ValueError):
    """A URL parameter that is not what the route takes (400)."""


def _json(data: Any, status: int = 200) -> Response:
    body = orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS, default=str)
    return Response(body, status, media_type="application/json", headers=_SECURITY_HEADERS)


def _error(message: str, status: int, code: str | None = None) -> Response:
    """An error in the server's one shape (OpenAI's ``{"error": {"message", ...}}``)."""
    return _json(error_body(message, type=error_type(status), code=code), status)


async def _refused(request: Request, exc: Exception) -> Response:
    """Starlette's own 404 / 405 (a static file that is not there, a method not routed) in
    the same shape, with the viewer's headers."""
    response = await http_exception_response(request, exc)
    for name, value in _SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response


def _param(value: str, pattern: re.Pattern[str], what: str) -> str:
    if not pattern.fullmatch(value):
        raise BadRequest(f"{what} {value[:80]!r} is not valid")
    return value


class Viewer:
    """The routes of the viewer over the art folder at ``path``."""

    def __init__(self, path: str | Path) -> None:
        self.art = ArtFolder(path)
        self.steps = StepCache()
        self.shell = (STATIC / "index.html").read_text(encoding="utf-8")

    async def _run(self, function: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(function, *args)

    async def _answer(self, request: Request, function: Callable[..., Any], *args: Any) -> Response:
        try:
            result = await self._run(function, *args)
        except NotFound as exc:
            return _error(str(exc), 404)
        except (BadRequest, TableQueryError) as exc:
            return _error(str(exc), 400)
        except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
            # A damaged record the readers did not expect: name it, keep serving.
            logger.warning("ui: %s failed: %s", request.url.path, exc)
            return _error(f"cannot read this record: {type(exc).__name__}: {exc}", 422)
        return result if isinstance(result, Response) else _json(result)

    # ------------------------------------------------------------------ pages
    async def page(self, request: Request) -> Response:
        if request.url.path.removeprefix(request.scope.get("root_path", "")).startswith("/api/"):
            return _error(
                f"no such route: {request.method} {shown_path(request.url.path)}",
                404,
                "route_not_found",
            )
        root = request.scope.get("root_path", "").rstrip("/")
        shell = self.shell.replace("{{root}}", html.escape(root, quote=True))
        return Response(shell, media_type="text/html", headers=_SECURITY_HEADERS)

    # ------------------------------------------------------------------ data
    def _model(self, request: Request) -> ModelRef:
        return self.art.model(request.path_params["project"], request.path_params["name"])

    def _runs(self) -> dict[str, Any]:
        models = self.art.models()
        runs = [run_summary(model, read_history(model.folder.history)) for model in models]
        problems = []
        if not self.art.path.is_dir():
            problems.append(f"{self.art.path} is not a folder")
        elif not runs:
            problems.append(
                f"no models in {self.art.path}: a model appears here once it is registered "
                "({project}/models/{name}/ with a model.json)"
            )
        return {"path": str(self.art.path), "runs": runs, "problems": problems}

    async def runs(self, request: Request) -> Response:
        return await self._answer(request, self._runs)

    def _run_page(self, request: Request) -> dict[str, Any] | Response:
        model = self._model(request)
        history = read_history(model.folder.history)
        known = request.query_params.get("known")
        if known is not None and known == str(history.size):
            return Response(status_code=204, headers=_SECURITY_HEADERS)
        diagnoses, diagnosis_problems = run_diagnoses(history.records)
        evals, eval_problems = run_evals(history.records)
        summary = run_summary(model, history)
        summary["problems"] = [*summary.get("problems", []), *diagnosis_problems, *eval_problems]
        return {
            "summary": summary,
            "history_size": history.size,
            "curves": run_curves(history.records),
            "metrics": recorded_metrics(history.records),
            "steps": step_files(model.folder),
            "diagnoses": diagnoses,
            "evals": evals,
        }

    async def run(self, request: Request) -> Response:
        return await self._answer(request, self._run_page, request)

    def _find_curve(self, request: Request) -> tuple[ModelRef, dict[str, Any]]:
        model = self._model(request)
        records = read_history(model.folder.history).records
        wanted = request.query_params.get("id")
        metric = request.query_params.get("metric")
        if metric is not None:
            curve = metric_curve(metric, records)
        else:
            curve = next((c for c in run_curves(records) if c["id"] == wanted), None)
        if curve is None:
            raise NotFound(f"no curve {metric or wanted!r} with points in {model.key}")
        return model, curve

    def _curve_json(self, request: Request) -> dict[str, Any]:
        return self._find_curve(request)[1]

    async def curve_json(self, request: Request) -> Response:
        return await self._answer(request, self._curve_json, request)

    def _curve(self, request: Request) -> Response:
        model, curve = self._find_curve(request)
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{model.name}-{curve['id']}")
        return Response(
            curve_csv(curve),
            media_type="text/csv",
            headers={
                **_SECURITY_HEADERS,
                "content-disposition": f'attachment; filename="{name}.csv"',
            },
        )

    async def curve(self, request: Request) -> Response:
        return await self._answer(request, self._curve, request)

    def _step_path(self, request: Request) -> tuple[ModelRef, str, int, Path]:
        model = self._model(request)
        split = _param(request.path_params["split"], _SPLIT, "split")
        step = int(_param(request.path_params["step"], _STEP, "step"))
        return model, split, step, model.folder.trajectories(split, step)

    def _step(self, request: Request) -> dict[str, Any]:
        model, split, step, path = self._step_path(request)
        index = self.steps.get(path)
        signal, signal_problems = read_signal(model.folder.training_signal(split, step))
        query = TableQuery.parse(request.query_params)
        rows = []
        for row in index.rows:
            record = signal.get(row["id"])
            rows.append({**row, "advantage": record.get("advantage") if record else None})
        page, total = query.apply(rows)
        return {
            "project": model.project,
            "name": model.name,
            "split": split,
            "step": step,
            "rows": page,
            "total": total,
            "rollouts": len(rows),
            "offset": query.offset,
            "limit": query.limit,
            "groups": index.groups,
            "exceptions": index.exceptions,
            "signal_recorded": bool(signal),
            "problems": index.problems + signal_problems,
            "steps": step_files(model.folder).get(split, []),
        }

    async def step(self, request: Request) -> Response:
        return await self._answer(request, self._step, request)

    def _rollout(self, request: Request) -> dict[str, Any]:
        model, split, step, path = self._step_path(request)
        trajectory_id = _param(request.path_params["rollout"], _ID, "rollout id")
        index = self.steps.get(path)
        trajectory, group, number, position = index.rollout(trajectory_id)
        signal, problems = read_signal(model.folder.training_signal(split, step))
        tokenizer, tokenizer_source = find_tokenizer(model, self.art.path)
        summary = index.rows[[r["id"] for r in index.rows].index(trajectory_id)]
        tokens = token_view(
            trajectory, signal.get(trajectory_id), tokenizer, trained_split=split == "train"
        )
        tokens["tokenizer"] = tokenizer_source
        histories = [
            {"messages": conversation({"messages_and_choices": h.get("messages_and_choices")})}
            for h in trajectory.get("additional_histories") or []
            if isinstance(h, dict)
        ]
        return {
            "project": model.project,
            "name": model.name,
            "split": split,
            "step": step,
            "summary": summary,
            "group": {
                "number": number,
                "position": position,
                "metadata": group.get("metadata"),
                "rollouts": [r["id"] for r in index.rows if r["group"] == number],
            },
            "messages": conversation(trajectory),
            "additional_histories": histories,
            "calls": call_details(trajectory),
            "tools": trajectory.get("tools")
            or next(
                (c.get("tools") for c in trajectory.get("calls") or [] if isinstance(c, dict)),
                None,
            ),
            "metadata": trajectory.get("metadata"),
            "metrics": trajectory.get("metrics"),
            "logs": (trajectory.get("logs") or [])[:200],
            "tokens": tokens,
            "problems": problems,
        }

    async def rollout(self, request: Request) -> Response:
        return await self._answer(request, self._rollout, request)

    def _compare(self, request: Request) -> dict[str, Any]:
        sides = []
        for side in ("a", "b"):
            value = request.query_params.get(side, "")
            parts = value.split("/")
            if len(parts) != 4:
                raise BadRequest(f"{side} must be project/model/split/step, got {value[:120]!r}")
            project, name, split, step_text = parts
            model = self.art.model(project, name)
            split = _param(split, _SPLIT, "split")
            step = int(_param(step_text, _STEP, "step"))
            index = self.steps.get(model.folder.trajectories(split, step))
            sides.append((value, index))
        (a_ref, a), (b_ref, b) = sides
        b_groups = {g["scenario"]: g for g in b.groups if g["scenario"] is not None}
        scenarios = []
        for group in a.groups:
            other = b_groups.get(group["scenario"])
            if group["scenario"] is None or other is None:
                continue
            scenarios.append(
                {
                    "scenario": group["scenario"],
                    "task": group["task"],
                    "a": self._compare_side(a, group),
                    "b": self._compare_side(b, other),
                }
            )
        return {
            "a": a_ref,
            "b": b_ref,
            "scenarios": scenarios,
            "only_a": sum(1 for g in a.groups if g["scenario"] not in b_groups),
            "problems": a.problems + b.problems,
        }

    @staticmethod
    def _compare_side(index: Any, group: dict[str, Any]) -> dict[str, Any]:
        rows = [r for r in index.rows if r["group"] == group["group"]]
        return {
            "group": group["group"],
            "mean_reward": group["mean_reward"],
            "rollouts": [{"id": r["id"], "reward": r["reward"]} for r in rows],
        }

    async def compare(self, request: Request) -> Response:
        return await self._answer(request, self._compare, request)


def build_ui_app(path: str | Path) -> ASGIApp:
    """The viewer over the art folder at ``path`` (read-only; mount it anywhere).

    Example:
        >>> app = build_ui_app(".art")
    """
    viewer = Viewer(path)
    model = "/api/runs/{project}/{name}"
    step = model + "/steps/{split}/{step}"
    page_methods = ["GET", "HEAD"]
    routes = [
        Route("/api/runs", viewer.runs, methods=page_methods),
        Route(model, viewer.run, methods=page_methods),
        Route(model + "/curve.csv", viewer.curve, methods=page_methods),
        Route(model + "/curve.json", viewer.curve_json, methods=page_methods),
        Route(step, viewer.step, methods=page_methods),
        Route(step + "/rollouts/{rollout}", viewer.rollout, methods=page_methods),
        Route("/api/compare", viewer.compare, methods=page_methods),
        Mount("/static", app=StaticFiles(directory=str(STATIC)), name="static"),
        Route("/", viewer.page, methods=page_methods),
        Route("/{page:path}", viewer.page, methods=page_methods),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: _refused})
