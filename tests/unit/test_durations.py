"""Durations typed by users (`--older-than 90d`): accepted forms, and clear errors otherwise."""

from __future__ import annotations

from datetime import timedelta

import pytest

from treadle.domain.durations import parse_duration
from treadle.errors import InvalidRequest


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("3600s", timedelta(seconds=3600)),
        ("1s", timedelta(seconds=1)),
        ("30m", timedelta(minutes=30)),
        ("12h", timedelta(hours=12)),
        ("90d", timedelta(days=90)),
        ("2w", timedelta(weeks=2)),
        (" 7D ", timedelta(days=7)),
        ("0365d", timedelta(days=365)),
    ],
)
def test_accepted_forms(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    "text", ["", "90", "d", "90x", "1.5h", "-5d", "+5d", "5 d", "5dd", "1h30m", "ninety days", "90days"]
)
def test_malformed_values_name_the_accepted_forms(text: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_duration(text)
    message = str(info.value)
    assert repr(text) in message
    for form in ("3600s", "30m", "12h", "90d", "2w"):
        assert form in message


@pytest.mark.parametrize("text", ["0s", "0d", "000w"])
def test_zero_is_rejected(text: str) -> None:
    with pytest.raises(InvalidRequest, match="greater than zero"):
        parse_duration(text)


def test_absurdly_large_value_is_an_input_error_not_a_crash() -> None:
    with pytest.raises(InvalidRequest, match="too large"):
        parse_duration("99999999999999w")
