"""Rendering for the CLI: rich tables for people, `--json` for scripts."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from functools import cache
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from rich.console import Console

    from treadle.engine.cancellation import Cancellation


@cache
def console() -> Console:
    """The console tables print on (rich is imported only by commands that print tables)."""
    from rich.console import Console

    # Piped output is read by people in logs too: do not squeeze tables to 80 columns there.
    return Console(width=None if sys.stdout.isatty() else 160)


def to_jsonable(value: Any) -> Any:
    """Turn dataclasses, datetimes and tuples into JSON-friendly values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [to_jsonable(v) for v in value]
    return value


def emit_json(value: Any) -> None:
    """Print a value as indented JSON."""
    click.echo(json.dumps(to_jsonable(value), indent=2, sort_keys=True))


def fmt_time(value: datetime | None) -> str:
    """A time for people: to the second, in UTC, saying so ("2026-05-01 12:00:00 UTC")."""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if value else "-"


def fmt_duration(seconds: float | None) -> str:
    """Human duration."""
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Print a table."""
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for c in columns:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*["-" if v is None else str(v) for v in r])
    console().print(t)


def show_cancellation(result: Cancellation, as_json: bool) -> None:
    """What a cancel changed: JSON, or one line."""
    if as_json:
        emit_json(result)
        return
    ruled_out = f"; ended by their trigger rules: {', '.join(result.ruled_out)}" if result.ruled_out else ""
    click.echo(
        f"cancelled {len(result.cancelled)} task instance(s) of {result.run_id}"
        f" ({len(result.running_killed)} running){ruled_out}; run is {result.run_state}"
    )
