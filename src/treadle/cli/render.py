"""Rendering for the CLI: plain-text tables for people, `--json` for scripts."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import time
from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TextIO

import click

if TYPE_CHECKING:
    from treadle.engine.cancellation import Cancellation

#: Characters between two columns.
GAP = "  "

#: The width tables are fitted to when stdout is not a terminal: piped output is read by people
#: in logs too, so it is not squeezed to 80 columns there.
PIPED_WIDTH = 160


def terminal_width() -> int:
    """The columns tables may use: the terminal's, or PIPED_WIDTH when stdout is not one."""
    if not sys.stdout.isatty():
        return PIPED_WIDTH
    return shutil.get_terminal_size((PIPED_WIDTH, 24)).columns


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


def _lines(text: str) -> list[str]:
    """The lines of a cell, tabs expanded (a cell of no characters is one empty line)."""
    return text.expandtabs(4).splitlines() or [""]


def fold(text: str, width: int) -> list[str]:
    """The lines of `text` at most `width` characters long: broken at the last space that fits,
    or inside a word longer than `width` (nothing is cut off)."""
    width = max(width, 1)
    lines: list[str] = []
    for line in _lines(text):
        while len(line) > width:
            cut = line.rfind(" ", 1, width + 1)
            if cut > 0:
                lines.append(line[:cut].rstrip())
                line = line[cut + 1 :]
            else:
                lines.append(line[:width])
                line = line[width:]
        lines.append(line)
    return lines


def fit_widths(natural: Sequence[int], available: int, floors: Sequence[int] | None = None) -> list[int]:
    """Column widths summing to at most `available`: every column its natural width when they
    all fit; otherwise the narrow columns keep theirs and the widest are narrowed to one shared
    cap, but none below its floor (its longest word, so that words stay whole); when the floors
    do not all fit either, the largest floors are lowered to a shared cap that fits."""
    if sum(natural) <= available:
        return list(natural)
    if available <= len(natural):
        return [1] * len(natural)
    lows = [max(1, min(f, n)) for f, n in zip(floors, natural, strict=True)] if floors else [1] * len(natural)
    if sum(lows) > available:  # the floors do not all fit: the longest give way, to a shared cap
        cap = max(c for c in range(1, max(lows) + 1) if sum(min(lo, c) for lo in lows) <= available)
        lows = [min(lo, cap) for lo in lows]

    def total(cap: int) -> int:
        return sum(max(lo, min(n, cap)) for lo, n in zip(lows, natural, strict=True))

    low, high = 1, max(natural)  # total(low) <= available < total(high)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if total(middle) <= available else (low, middle)
    widths = [max(lo, min(n, low)) for lo, n in zip(lows, natural, strict=True)]
    spare = available - sum(widths)
    for i, n in enumerate(natural):  # fewer than the columns at the cap: one more each, in order
        if spare == 0:
            break
        if widths[i] == low < n:
            widths[i] += 1
            spare -= 1
    return widths


#: Words longer than this may be broken to make room for the other columns (a DAG id or a
#: file name up to this long stays whole while the other columns can give way).
LONGEST_WHOLE_WORD = 40


def _longest_word(text: str) -> int:
    return max((len(word) for word in text.split()), default=0)


def _width(text: str) -> int:
    return max(len(line) for line in _lines(text))


def format_table(
    title: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[object]],
    *,
    width: int,
    right: Collection[int] = (),
) -> str:
    """A table as text: the title line, the header, a separator and the rows, its columns fitted
    to `width` characters; a cell too long for its column continues on the lines below, None is
    shown as `-`, and the columns numbered in `right` are aligned to the right."""
    cells = [["-" if v is None else str(v) for v in row] for row in rows]
    natural = [max(1, _width(c), *(_width(r[i]) for r in cells if i < len(r))) for i, c in enumerate(columns)]
    floors = [
        min(LONGEST_WHOLE_WORD, max(1, _longest_word(c), *(_longest_word(r[i]) for r in cells if i < len(r))))
        for i, c in enumerate(columns)
    ]
    widths = fit_widths(natural, width - len(GAP) * (len(columns) - 1), floors)

    def lines_of(row: Sequence[str]) -> list[str]:
        folded = [fold(row[i] if i < len(row) else "", w) for i, w in enumerate(widths)]
        out = []
        for n in range(max(len(f) for f in folded)):
            parts = [f[n] if n < len(f) else "" for f in folded]
            padded = [
                p.rjust(w) if i in right else p.ljust(w)
                for i, (p, w) in enumerate(zip(parts, widths, strict=True))
            ]
            out.append(GAP.join(padded).rstrip())
        return out

    out = [title] if title else []
    out += lines_of(list(columns))
    out.append(GAP.join("-" * w for w in widths))
    for row in cells:
        out += lines_of(row)
    return "\n".join(out)


def table(
    title: str, columns: Sequence[str], rows: Sequence[Sequence[object]], *, right: Collection[int] = ()
) -> None:
    """Print a table fitted to the terminal (see format_table), and a blank line after it (what
    follows, often another table, stands apart)."""
    click.echo(format_table(title, columns, rows, width=terminal_width(), right=right) + "\n")


def bar(fraction: float, width: int = 30) -> str:
    """A progress bar of `width` characters, `fraction` (0 to 1) of it filled."""
    filled = round(max(0.0, min(fraction, 1.0)) * width)
    return "#" * filled + "." * (width - filled)


def fmt_elapsed(seconds: float) -> str:
    """Elapsed time as H:MM:SS."""
    whole = int(seconds)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


class StatusLine:
    """One line of progress: redrawn in place on a terminal; elsewhere (a log, a pipe) printed
    only when its status changes, so a long wait adds no lines."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stdout
        self.tty = self.stream.isatty()
        self._status: str | None = None
        self._drawn = 0

    def show(self, status: str, suffix: str = "") -> None:
        """Show `status` followed by `suffix` (what changes all the time, like the elapsed time:
        off a terminal a change of the suffix alone prints nothing)."""
        line = f"{status} {suffix}".rstrip()
        if self.tty:
            line = line[: max(shutil.get_terminal_size().columns - 1, 1)]
            self.stream.write("\r" + line.ljust(self._drawn))
            self._drawn = len(line)
        elif status != self._status:
            self.stream.write(line + "\n")
        self._status = status
        self.stream.flush()

    def end(self) -> None:
        """Leave the line: later output starts on a line of its own."""
        if self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
        self._drawn = 0


def log_line(what: str, stream: TextIO | None = None) -> None:
    """Print `what` after the time of day (HH:MM:SS), on stderr unless told otherwise."""
    out = stream if stream is not None else sys.stderr
    out.write(f"[{time.strftime('%H:%M:%S')}] {what}\n")
    out.flush()


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
