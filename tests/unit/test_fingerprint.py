"""Fingerprints group failures that differ only in ids and numbers."""

from __future__ import annotations

from treadle.domain.fingerprint import fingerprint, normalise_message


def test_numbers_ids_and_quoted_values_are_normalised() -> None:
    a = normalise_message(
        "row 17 of 'orders_2026.csv' failed at 0x7f3a, id 1b4e28ba-2fa1-11d2-883f-0016d3cca427"
    )
    b = normalise_message("row 9 of 'orders_2027.csv' failed at 0x1, id 6ba7b810-9dad-11d1-80b4-00c04fd430c8")
    assert a == b


def test_same_error_same_place_same_fingerprint() -> None:
    assert fingerprint("KeyError", "key 'a1'", "etl.py:load") == fingerprint(
        "KeyError", "key 'b2'", "etl.py:load"
    )


def test_other_place_or_type_gives_other_fingerprint() -> None:
    base = fingerprint("KeyError", "missing", "etl.py:load")
    assert base != fingerprint("KeyError", "missing", "etl.py:extract")
    assert base != fingerprint("ValueError", "missing", "etl.py:load")


def test_run_ids_and_hex_tokens_do_not_split_groups() -> None:
    a = "feed for run manual__20261130T011240.085000Z__03c505 missing (token 9f8e7d6c)"
    b = "feed for run manual__20261201T020000.000000Z__ab12cd missing (token 0a1b2c3d4e)"
    assert normalise_message(a) == normalise_message(b)
