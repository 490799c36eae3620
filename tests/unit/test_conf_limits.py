"""Conf limits: nesting depth measured on text (before parsing) and on values, and the size cap."""

from __future__ import annotations

import json

import pytest

from treadle.domain.conf_limits import (
    MAX_CONF_BYTES,
    MAX_CONF_DEPTH,
    check_conf_depth,
    check_conf_limits,
    json_text_depth,
    json_value_depth,
)
from treadle.errors import InvalidRequest


def _nested(levels: int) -> object:
    value: object = 1
    for n in range(levels):
        value = {"a": value} if n % 2 else [value]
    return value


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        ("1", 0),
        ('"[{"', 0),
        ("{}", 1),
        ('{"a": [1, {"b": []}]}', 4),
        ('{"a": "]]]}}}", "b": [[2]]}', 3),
        (r'{"a": "quote \" then [[[", "b": {}}', 2),
        (r'{"a": "backslash \\", "b": [[]]}', 3),
        ("[" * 5000 + "]" * 5000, 5000),
    ],
)
def test_text_depth_ignores_brackets_inside_strings(text: str, depth: int) -> None:
    assert json_text_depth(text) == depth


@pytest.mark.parametrize("levels", [0, 1, 2, 7, 32, 33, 5000])
def test_value_depth_agrees_with_text_depth(levels: int) -> None:
    value = _nested(levels)
    assert json_value_depth(value) == levels
    if levels < 500:  # json itself cannot serialize much deeper values
        assert json_text_depth(json.dumps(value)) == levels


def test_depth_over_the_maximum_is_refused_naming_it() -> None:
    check_conf_depth(MAX_CONF_DEPTH)
    with pytest.raises(InvalidRequest) as info:
        check_conf_depth(5000, source="--conf")
    assert str(info.value) == "--conf is nested 5000 levels deep, over the maximum depth of 32 levels"


def test_limits_on_a_conf_value() -> None:
    check_conf_limits({"a": _nested(MAX_CONF_DEPTH - 1)})
    with pytest.raises(InvalidRequest, match="conf is nested 5001 levels deep, over the maximum depth of 32"):
        check_conf_limits({"a": _nested(5000)})
    with pytest.raises(InvalidRequest, match=r"over the limit of 65536 bytes \(64 KiB\)"):
        check_conf_limits({"blob": "x" * MAX_CONF_BYTES})
    check_conf_limits({"blob": "x" * (MAX_CONF_BYTES - 20)})
