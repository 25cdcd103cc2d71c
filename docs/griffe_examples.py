"""A griffe extension for the API reference (mkdocs.yml loads it into mkdocstrings): a
docstring's ``Example:`` section is read as Google style's ``Examples:``.

The code's docstrings head their doctests ``Example:`` (as Napoleon reads them); griffe knows
only the plural, and takes ``Example:`` for an admonition whose body is Markdown, where a
``>>>`` line is a block quote and an output like ``[1.0, 0.0]`` a broken link. As an examples
section, the ``>>>`` lines become Python code blocks and their outputs stay with them.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE_HEADING = re.compile(r"^Example:[ \t]*$", re.MULTILINE)


class ExampleSections(griffe.Extension):
    """Renames each docstring's ``Example:`` section heading to ``Examples:``."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        _rename(pkg)  # the package itself: on_object below runs for its members only

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        _rename(obj)


def _rename(obj: griffe.Object) -> None:
    if obj.docstring is not None:
        obj.docstring.value = _EXAMPLE_HEADING.sub("Examples:", obj.docstring.value)
