"""Completions (placeholder until its module lands)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response

from art_core.gateway.errors import APIError

if TYPE_CHECKING:
    from art_core.gateway.app import Gateway


async def create(gateway: Gateway, request: Request) -> Response:
    raise APIError(404, "not served yet", type="not_found_error")
