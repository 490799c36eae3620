"""Identifier rule shared by DAG ids, task ids and run ids."""

from __future__ import annotations

import re

IDENTIFIER = re.compile(r"^[A-Za-z0-9._-]{1,250}$")


def is_identifier(value: str) -> bool:
    """Return True if `value` may be used as an id (letters, digits, `.`, `_`, `-`; 1-250)."""
    return bool(IDENTIFIER.match(value))
