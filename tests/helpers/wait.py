"""Poll a condition with a deadline (tests never sleep for a fixed time to wait for a state)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    condition: Callable[[], T], *, timeout: float = 30.0, interval: float = 0.05, message: str = "condition"
) -> T:
    """Return the first truthy value of `condition()`, or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: T = condition()
    while not last:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)
        last = condition()
    return last
