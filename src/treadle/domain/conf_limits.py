"""Limits on a trigger's conf: nesting depth and serialized size. Pure: no I/O.

The depth is checked on the text before it is parsed too, because Python's json raises
RecursionError on deep nesting instead of a clear error.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from treadle.errors import InvalidRequest

#: Deepest nesting of objects and arrays a conf may have (`{}` is 1 level, `{"a": []}` 2).
MAX_CONF_DEPTH = 32
#: Largest accepted conf, serialized as JSON.
MAX_CONF_BYTES = 64 * 1024

#: A JSON string literal, escapes included: brackets inside one do not nest.
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)


def json_text_depth(text: str) -> int:
    """Deepest nesting of objects and arrays in JSON text, found without parsing it."""
    depth = deepest = 0
    for char in _STRING.sub("", text):
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def json_value_depth(value: object) -> int:
    """Deepest nesting of dicts and lists (tuples too) in a parsed value; a scalar is 0."""
    deepest = 0
    # An explicit stack: the value may be as deep as whatever produced it allowed.
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = _children(item)
        if children is not None:
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in children)
    return deepest


def _children(item: object) -> list[object] | None:
    if isinstance(item, Mapping):
        return list(item.values())
    if isinstance(item, list | tuple):
        return list(item)
    return None


def check_conf_depth(depth: int, *, source: str = "conf") -> None:
    """Raise InvalidRequest if `depth` is over MAX_CONF_DEPTH; `source` names the input."""
    if depth > MAX_CONF_DEPTH:
        raise InvalidRequest(
            f"{source} is nested {depth} levels deep, over the maximum depth of {MAX_CONF_DEPTH} levels"
        )


def check_conf_limits(conf: Mapping[str, Any]) -> None:
    """Raise InvalidRequest if `conf` is nested too deep or larger than MAX_CONF_BYTES as JSON."""
    check_conf_depth(json_value_depth(conf))
    # Depth first: serializing a deeply nested value would itself raise RecursionError.
    size = len(json.dumps(conf).encode())
    if size > MAX_CONF_BYTES:
        limit = f"{MAX_CONF_BYTES} bytes ({MAX_CONF_BYTES // 1024} KiB)"
        raise InvalidRequest(f"conf is {size} bytes as JSON, over the limit of {limit}")
