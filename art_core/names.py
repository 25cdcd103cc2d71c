"""Names that become folder names (models, projects, splits): the one rule for them.

A name is 1-128 ASCII letters, digits, ``.``, ``_`` or ``-``, starts with a letter or digit
and contains no ``..``: no path separators, no hidden files, no parent folders, no control
characters (the whole string is matched, so a trailing newline is refused too).
"""

from __future__ import annotations

import re

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def is_valid_name(value: object) -> bool:
    """Whether ``value`` is a usable model, project or split name.

    Example:
        >>> is_valid_name("agent-001"), is_valid_name("a\\n"), is_valid_name("../x")
        (True, False, False)
    """
    return isinstance(value, str) and _NAME.fullmatch(value) is not None and ".." not in value


def check_name(value: str, what: str) -> str:
    """``value`` when it is a valid name, else ``ValueError`` naming ``what`` and the rule.

    Example:
        >>> check_name("demo", "project name")
        'demo'
    """
    if not is_valid_name(value):
        raise ValueError(
            f"{what} {value!r} must be 1-128 letters, digits, '.', '_' or '-', start with a "
            "letter or digit, and not contain '..'"
        )
    return value
