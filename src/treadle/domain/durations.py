"""Human durations such as `90d` or `12h`, parsed into timedeltas (pure: no clock, no I/O)."""

from __future__ import annotations

import re
from datetime import timedelta

from treadle.errors import InvalidRequest

#: Seconds in one of each accepted unit.
UNIT_SECONDS: dict[str, int] = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}

ACCEPTED_FORMS = "a positive whole number followed by s, m, h, d or w (e.g. 3600s, 30m, 12h, 90d, 2w)"

#: Execution timeout given to a task that sets none, unless the deployment says otherwise
#: (TREADLE_DEFAULT_TASK_TIMEOUT). Applied to task instances when their run is created, never
#: part of a version: changing it changes no version hash. Here, not in dag_version, so that the
#: settings read by every command do not import the DAG structure's modules.
DEFAULT_TASK_TIMEOUT_S = 24 * 3600.0

_PATTERN = re.compile(r"(?P<amount>[0-9]+)(?P<unit>[smhdw])")


def parse_duration(text: str) -> timedelta:
    """Parse `90d`, `12h`, `30m`, `3600s` or `2w` into a timedelta.

    Args:
        text: The duration as typed by a user; surrounding blanks and letter case are ignored.

    Returns:
        The duration, always greater than zero.

    Raises:
        InvalidRequest: The text is not one of the accepted forms, or is zero.
    """
    match = _PATTERN.fullmatch(text.strip().lower())
    if match is None:
        raise InvalidRequest(f"invalid duration {text!r}: expected {ACCEPTED_FORMS}")
    amount = int(match["amount"])
    if amount == 0:
        raise InvalidRequest(f"invalid duration {text!r}: must be greater than zero")
    try:
        return timedelta(seconds=amount * UNIT_SECONDS[match["unit"]])
    except OverflowError:
        # timedelta caps at 999,999,999 days; a typo with many digits is an input error.
        raise InvalidRequest(f"invalid duration {text!r}: too large") from None
