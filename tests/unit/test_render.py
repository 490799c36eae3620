"""The CLI's plain-text tables and progress lines (cli/render.py)."""

from __future__ import annotations

import io

import pytest
from click.testing import CliRunner

from treadle.cli import render
from treadle.cli.render import StatusLine, fit_widths, fold, format_table


def test_a_table_is_a_title_a_header_a_separator_and_rows_in_aligned_columns() -> None:
    text = format_table("Runs", ["id", "state"], [("r-1", "success"), ("run-22", "failed")], width=80)
    assert text.splitlines() == [
        "Runs",
        "id      state",
        "------  -------",
        "r-1     success",
        "run-22  failed",
    ]


def test_an_empty_title_prints_no_title_line_and_no_rows_leave_the_header() -> None:
    assert format_table("", ["id", "state"], [], width=80).splitlines() == ["id  state", "--  -----"]


def test_none_is_a_dash_and_other_values_their_str() -> None:
    text = format_table("t", ["a", "b", "c"], [(None, 3, 1.5)], width=80)
    assert text.splitlines()[-1] == "-  3  1.5"


def test_right_aligned_columns_pad_on_the_left() -> None:
    rows = [("chain", "1 ms"), ("fan-out", "12 ms")]
    text = format_table("t", ["workload", "p50"], rows, width=80, right={1})
    assert text.splitlines()[1:] == [
        "workload    p50",
        "--------  -----",
        "chain      1 ms",
        "fan-out   12 ms",
    ]


def test_a_long_cell_is_folded_onto_continuation_lines_in_its_column_and_nothing_is_lost() -> None:
    long = "x" * 45
    text = format_table("t", ["id", "error"], [("r1", long), ("r2", "short")], width=24)
    lines = text.splitlines()
    assert all(len(line) <= 24 for line in lines), lines
    assert lines[3:] == ["r1  " + "x" * 20, "    " + "x" * 20, "    xxxxx", "r2  short"]


def test_folding_breaks_at_the_last_space_that_fits_and_inside_longer_words() -> None:
    assert fold("the quick brown fox", 10) == ["the quick", "brown fox"]
    assert fold("abcdefghij klm", 4) == ["abcd", "efgh", "ij", "klm"]
    assert fold("two\nlines", 10) == ["two", "lines"]
    assert fold("crlf\r\nand\ttab", 10) == ["crlf", "and tab"]
    assert fold("", 5) == [""]


def test_columns_keep_their_natural_width_while_they_fit_and_the_widest_are_narrowed() -> None:
    assert fit_widths([3, 10, 40], 100) == [3, 10, 40]
    assert fit_widths([3, 10, 40], 30) == [3, 10, 17]
    assert fit_widths([3, 30, 40], 30) == [3, 14, 13]
    assert sum(fit_widths([5, 50, 50, 50], 61)) == 61
    assert fit_widths([5, 5], 1) == [1, 1]


def test_a_narrowed_column_keeps_its_longest_word_whole_while_the_floors_fit() -> None:
    assert fit_widths([10, 30, 40], 46) == [10, 18, 18]
    assert fit_widths([10, 30, 40], 46, floors=[10, 14, 20]) == [10, 16, 20]
    # They do not all fit: the largest floor gives way, the smaller ones stay whole.
    assert fit_widths([10, 30, 40], 40, floors=[10, 14, 20]) == [10, 14, 16]
    text = format_table("t", ["zone", "note"], [("Asia/Singapore", " ".join(["word"] * 10))], width=20)
    lines = text.splitlines()[3:]
    assert (
        lines[:2] == ["Asia/Singapore  word", "                word"] and len(lines) == 10
    )  # not "Asia/Sing"


def test_the_widths_are_those_of_characters_not_bytes() -> None:
    text = format_table("Café", ["naïve", "n"], [("日本語", 1), ("é", 2)], width=80)
    assert text.splitlines() == ["Café", "naïve  n", "-----  -", "日本語    1", "é      2"]


def test_tables_fill_160_columns_when_stdout_is_not_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(render.sys, "stdout", io.StringIO())
    assert render.terminal_width() == 160
    runner = CliRunner()
    with runner.isolation() as (out, _err, _):
        render.table("t", ["a", "b"], [("x" * 100, "y" * 100)])
    lines = out.getvalue().decode().splitlines()
    assert max(len(line) for line in lines) == 160
    assert "".join(line[:79].strip() for line in lines[3:]) == "x" * 100


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_status_line_is_redrawn_in_place() -> None:
    out = _Terminal()
    line = StatusLine(out)
    line.show("backfill 1 3/10 longer counts", "0:00:01")
    line.show("backfill 1 4/10", "0:00:02")
    line.end()
    first, second = out.getvalue().split("\r")[1:]
    assert first == "backfill 1 3/10 longer counts 0:00:01"
    assert second.rstrip() == "backfill 1 4/10 0:00:02" and len(second) == len(first) + 1
    assert second.endswith("\n") and "\n" not in first


def test_off_a_terminal_a_status_line_is_printed_only_when_the_status_changes() -> None:
    out = io.StringIO()
    line = StatusLine(out)
    line.show("backfill 1 3/10", "0:00:01")
    line.show("backfill 1 3/10", "0:00:02")
    line.show("backfill 1 4/10", "0:00:03")
    line.end()
    assert out.getvalue() == "backfill 1 3/10 0:00:01\nbackfill 1 4/10 0:00:03\n"


def test_the_bar_and_elapsed_time() -> None:
    assert render.bar(0.5, 10) == "#####....."
    assert render.bar(2.0, 4) == "####" and render.bar(-1, 4) == "...."
    assert render.fmt_elapsed(3725.9) == "1:02:05"


def test_log_lines_carry_the_time_of_day() -> None:
    out = io.StringIO()
    render.log_line("chain-100: starting", out)
    assert out.getvalue()[0] == "[" and out.getvalue()[9:] == "] chain-100: starting\n"
