"""Cross-field params rules: each rule's verdicts, reported with the JSON Schema's, and their
definitions checked when the DAG is built."""

from __future__ import annotations

from typing import Any

import pytest

from treadle import Param, ParamRule, dag, task
from treadle.domain.dag_version import DagStructure
from treadle.domain.params import resolve_params
from treadle.errors import DagDefinitionError, ParamsInvalid


def problems(rules: list[ParamRule], conf: dict[str, Any], schema: dict[str, Any] | None = None) -> list[str]:
    """Every violation as "path: message" (empty when the conf is accepted)."""
    try:
        resolve_params("d", schema, conf, rules=rules)
    except ParamsInvalid as exc:
        return [f"{v.path}: {v.message}" for v in exc.violations]
    return []


ORDERED = ParamRule.ordered("from_date", "to_date")


@pytest.mark.parametrize(
    ("conf", "expected"),
    [
        ({"from_date": "2026-01-01", "to_date": "2026-01-31"}, []),
        ({"from_date": "2026-01-31", "to_date": "2026-01-31"}, []),
        (
            {"from_date": "2026-02-01", "to_date": "2026-01-31"},
            ['$.to_date: must be on or after \'from_date\' ("2026-02-01"), got "2026-01-31"'],
        ),
        ({"from_date": "2026-01-31T23:00:00+00:00", "to_date": "2026-02-01T01:00:00+02:00"}, []),
        (
            {"from_date": "2026-02-01T00:30:00+00:00", "to_date": "2026-02-01T01:00:00+02:00"},
            [
                "$.to_date: must be on or after 'from_date' (\"2026-02-01T00:30:00+00:00\"), "
                'got "2026-02-01T01:00:00+02:00"'
            ],
        ),
        ({"from_date": "2026-01-01"}, []),  # required-ness is the schema's business
        ({"from_date": None, "to_date": "2026-01-01"}, []),
        (
            {"from_date": "2026-01-01", "to_date": "next tuesday"},
            [
                "$.to_date: cannot be compared with 'from_date': both must be numbers or both ISO-8601 "
                "dates or times"
            ],
        ),
        (
            {"from_date": "2026-01-01", "to_date": 5},
            [
                "$.to_date: cannot be compared with 'from_date': both must be numbers or both ISO-8601 "
                "dates or times"
            ],
        ),
        (
            {"from_date": "2026-01-01T00:00:00+00:00", "to_date": "2026-01-02"},
            ["$.to_date: cannot be compared with 'from_date': one has a time zone and the other has none"],
        ),
    ],
)
def test_ordered_dates_and_times(conf: dict[str, Any], expected: list[str]) -> None:
    assert problems([ORDERED], conf) == expected


def test_ordered_numbers_and_strict_order() -> None:
    low_high = ParamRule.ordered("low", "high")
    assert problems([low_high], {"low": 1, "high": 2.5}) == []
    assert problems([low_high], {"low": 2, "high": 2}) == []
    assert problems([low_high], {"low": 3, "high": 2}) == ["$.high: must be at least 'low' (3), got 2"]
    strict = ParamRule.ordered("low", "high", strict=True)
    assert problems([strict], {"low": 2, "high": 2}) == ["$.high: must be greater than 'low' (2), got 2"]
    assert problems([strict], {"low": 1, "high": 2}) == []
    dates = ParamRule.ordered("a", "b", strict=True)
    assert problems([dates], {"a": "2026-01-01", "b": "2026-01-01"}) == [
        '$.b: must be after \'a\' ("2026-01-01"), got "2026-01-01"'
    ]
    # true is not a number here, even though Python treats it as 1.
    assert problems([low_high], {"low": True, "high": 2}) == [
        "$.high: cannot be compared with 'low': both must be numbers or both ISO-8601 dates or times"
    ]


def test_max_range() -> None:
    rule = ParamRule.max_range("from_date", "to_date", days=31)
    assert problems([rule], {"from_date": "2026-01-01", "to_date": "2026-02-01"}) == []
    assert problems([rule], {"from_date": "2026-01-01", "to_date": "2026-02-02"}) == [
        "$.to_date: the range from 'from_date' to 'to_date' is 32 days, longer than the 31 days allowed"
    ]
    # A reversed range is short; ordering is another rule's business.
    assert problems([rule], {"from_date": "2026-03-01", "to_date": "2026-01-01"}) == []
    hours = ParamRule.max_range("start", "end", hours=1, minutes=30)
    assert problems([hours], {"start": "2026-01-01T00:00:00Z", "end": "2026-01-01T01:30:00Z"}) == []
    assert problems([hours], {"start": "2026-01-01T00:00:00Z", "end": "2026-01-01T02:00:00Z"}) == [
        "$.end: the range from 'start' to 'end' is 2 hours, longer than the 1.5 hours allowed"
    ]
    assert problems([hours], {"start": 1, "end": 2}) == [
        "$.end: cannot be compared with 'start': both must be ISO-8601 dates or times"
    ]


def test_requires() -> None:
    rule = ParamRule.requires("mode", "BACKFILL", "reason", "ticket")
    assert problems([rule], {"mode": "NORMAL"}) == []
    assert problems([rule], {}) == []
    assert problems([rule], {"mode": "BACKFILL", "reason": "fix #12", "ticket": 12}) == []
    assert problems([rule], {"mode": "BACKFILL", "reason": "", "ticket": None}) == [
        "$.reason: required when 'mode' is \"BACKFILL\"",
        "$.ticket: required when 'mode' is \"BACKFILL\"",
    ]
    flag = ParamRule.requires("full", True, "reason")
    assert problems([flag], {"full": 1}) == []  # 1 is not true in JSON
    assert problems([flag], {"full": True}) == ["$.reason: required when 'full' is true"]


SCHEMA_DAG_PARAMS = {
    "from_date": Param("2026-01-01", type="string", format="date"),
    "to_date": Param("2026-01-02", type="string", format="date"),
    "mode": Param("NORMAL", enum=["NORMAL", "BACKFILL"]),
    "reason": Param(None, type=["string", "null"]),
    "secret_from": Param(1, type="integer", writeOnly=True),
    "until": Param(2, type="integer"),
}


@task
def noop() -> None:
    return None


@dag(
    dag_id="ranged",
    params=SCHEMA_DAG_PARAMS,
    param_rules=[
        ParamRule.ordered("from_date", "to_date"),
        ParamRule.max_range("from_date", "to_date", days=31),
        ParamRule.requires("mode", "BACKFILL", "reason"),
        ParamRule.ordered("secret_from", "until"),
    ],
)
def ranged() -> None:
    noop()


def resolve(conf: dict[str, Any]) -> dict[str, Any]:
    s = ranged.structure()
    return resolve_params("ranged", s.params_schema, conf, rules=s.param_rules)


def test_rule_and_schema_violations_are_reported_together() -> None:
    with pytest.raises(ParamsInvalid) as err:
        resolve({"from_date": "2026-03-01", "to_date": "2026-02-01", "mode": "BACKFILL", "extra": 1})
    assert [(v.path, v.message) for v in err.value.violations] == [
        (
            "$.extra",
            "unknown key 'extra' (the DAG accepts: from_date, mode, reason, secret_from, to_date, until)",
        ),
        ("$.reason", "required when 'mode' is \"BACKFILL\""),
        ("$.to_date", 'must be on or after \'from_date\' ("2026-03-01"), got "2026-02-01"'),
    ]
    assert "3 problem(s)" in str(err.value)
    assert resolve({"from_date": "2026-01-05", "to_date": "2026-01-20"})["mode"] == "NORMAL"


def test_a_value_the_schema_rejects_is_not_judged_again_by_a_rule() -> None:
    with pytest.raises(ParamsInvalid) as err:
        resolve({"from_date": 20260101, "to_date": "2026-01-02"})
    assert [v.path for v in err.value.violations] == ["$.from_date"]


def test_secret_values_are_never_quoted() -> None:
    with pytest.raises(ParamsInvalid) as err:
        resolve({"secret_from": 987654, "until": 2})
    (violation,) = err.value.violations
    assert violation.path == "$.until"
    assert violation.message == "must be at least 'secret_from'"
    assert "987654" not in str(err.value)


def test_rules_are_stored_with_the_structure_and_read_back() -> None:
    s = ranged.structure()
    stored = s.to_json()["param_rules"]
    assert stored[0] == {"rule": "ordered", "first": "from_date", "second": "to_date", "strict": False}
    assert stored[1] == {"rule": "max_range", "start": "from_date", "end": "to_date", "max_s": 2678400.0}
    assert stored[2] == {"rule": "requires", "when": "mode", "equals": "BACKFILL", "required": ["reason"]}
    again = DagStructure.from_json(s.to_json())
    assert again.param_rules == s.param_rules
    assert again.content_hash() == s.content_hash()
    assert [r.describe() for r in s.param_rules] == [
        "from_date <= to_date",
        "to_date - from_date <= 31 days",
        'reason required when mode = "BACKFILL"',
        "secret_from <= until",
    ]
    with pytest.raises(DagDefinitionError, match="unknown param rule 'between'"):
        DagStructure.from_json({**s.to_json(), "param_rules": [{"rule": "between"}]})


def test_a_dag_without_params_schema_still_checks_its_rules() -> None:
    @dag(dag_id="free", param_rules=[ParamRule.ordered("a", "b")])
    def free() -> None:
        noop()

    s = free.structure()
    assert resolve_params("free", None, {"a": 1, "b": 2, "c": 3}, rules=s.param_rules) == {
        "a": 1,
        "b": 2,
        "c": 3,
    }
    with pytest.raises(ParamsInvalid, match=r"\$\.b: must be at least 'a'"):
        resolve_params("free", None, {"a": 3, "b": 2}, rules=s.param_rules)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ParamRule.ordered("from-date", "to"), "'from-date' is not a param name"),
        (lambda: ParamRule.ordered("a", "a"), "names a param twice"),
        (lambda: ParamRule.ordered("a", "b", strict="yes"), "strict must be True or False"),
        (lambda: ParamRule.max_range("a", "b"), "needs a span greater than zero"),
        (lambda: ParamRule.max_range("a", "b", days=-1), "needs a span greater than zero"),
        (lambda: ParamRule.requires("mode", "X"), "needs at least one param that becomes required"),
        (lambda: ParamRule.requires("mode", {1, 2}, "reason"), "to match must be JSON"),
        (lambda: ParamRule.requires("mode", "X", "mode"), "names a param twice"),
        (lambda: ParamRule.requires("mode", "X", 3), "3 is not a param name"),
    ],
)
def test_malformed_rules_are_refused(make: Any, message: str) -> None:
    with pytest.raises(DagDefinitionError, match=message):
        make()


def test_rules_naming_params_the_dag_does_not_accept_are_refused() -> None:
    with pytest.raises(DagDefinitionError) as err:

        @dag(
            dag_id="typo",
            params={"from_date": "2026-01-01"},
            param_rules=[ParamRule.ordered("from_date", "to")],
        )
        def typo() -> None:
            noop()

    assert str(err.value) == (
        "dag 'typo': param rule 'from_date <= to' names 'to', which is not a param of this DAG "
        "(params: from_date)"
    )

    @dag(
        dag_id="extras",
        params={"from_date": "2026-01-01"},
        allow_extra_params=True,
        param_rules=[ParamRule.ordered("from_date", "to")],
    )
    def extras() -> None:
        noop()

    assert len(extras.structure().param_rules) == 1
    with pytest.raises(DagDefinitionError, match="param_rules must hold ParamRule objects"):

        @dag(dag_id="wrong", param_rules=[("a", "<=", "b")])
        def wrong() -> None:
            noop()

    with pytest.raises(DagDefinitionError, match="param_rules must be a list of ParamRule"):

        @dag(dag_id="bare", param_rules=ParamRule.ordered("a", "b"))  # type: ignore[arg-type]
        def bare() -> None:
            noop()


def test_a_scheduled_dag_whose_defaults_break_its_rules_is_refused() -> None:
    with pytest.raises(DagDefinitionError) as err:

        @dag(
            dag_id="nightly",
            schedule="@daily",
            params={"from_date": "2026-02-01", "to_date": "2026-01-01"},
            param_rules=[ParamRule.ordered("from_date", "to_date")],
        )
        def nightly() -> None:
            noop()

    assert "scheduled runs take the params' defaults, which break its rules" in str(err.value)
    assert "$.to_date: must be on or after 'from_date'" in str(err.value)
