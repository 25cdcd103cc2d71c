"""A settings dataclass with keyword overrides, as the integrations' ``train`` functions
take them: ``train(..., options, steps=3)``."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def with_overrides(settings: T, overrides: Mapping[str, Any], *, caller: str) -> T:
    """``settings`` (a dataclass instance) with ``overrides`` replacing its fields; a name
    that is no field raises ``TypeError`` naming it, as Python does for ``caller``.

    Example:
        >>> @dataclasses.dataclass(frozen=True)
        ... class Settings:
        ...     steps: int = 1
        >>> with_overrides(Settings(), {"steps": 3}, caller="train()").steps
        3
    """
    fields = {field.name for field in dataclasses.fields(settings)}  # type: ignore[arg-type]
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise TypeError(f"{caller} got unexpected keyword arguments: {', '.join(unknown)}")
    return dataclasses.replace(settings, **overrides)  # type: ignore[type-var]
