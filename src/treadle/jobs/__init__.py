"""Submit-then-poll jobs that ship with treadle (see `treadle.Deferred`)."""

from __future__ import annotations

from treadle.jobs.local import LocalProcessJob

__all__ = ["LocalProcessJob"]
