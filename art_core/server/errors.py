"""The service's 422 body: the gateway's error shape plus a ``detail`` list of every field."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from art_core.gateway.errors import error_body, field_path, validation_message


def validation_body(exc: ValidationError, prefix: str = "") -> dict[str, Any]:
    """A 422 body naming every invalid field (the first one as ``param``).

    Example:
        >>> from art_core.server.schemas import LogRequest
        >>> try:
        ...     LogRequest.model_validate({"split": 3})
        ... except ValidationError as exc:
        ...     validation_body(exc)["error"]["param"]
        'split'
    """
    details = [
        {
            "field": field_path(error["loc"], prefix),
            "message": str(error["msg"]).removeprefix("Value error, "),
            "type": error["type"],
        }
        for error in exc.errors(include_url=False, include_input=False)[:20]
    ]
    message, param = validation_message(exc, prefix)
    body = error_body(message, type="invalid_request_error", param=param, code="validation_error")
    body["detail"] = details
    return body
