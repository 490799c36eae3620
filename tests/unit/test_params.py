"""DAG params: the schema built from Param / plain defaults, and a trigger's conf resolved against it."""

from __future__ import annotations

import copy
import enum
from pathlib import Path
from typing import Any

import pytest

from treadle import errors
from treadle.authoring.params import NOTSET, Param, build_params_schema
from treadle.domain import params as domain_params
from treadle.domain.params import ParamViolation, check_schema, resolve_params
from treadle.errors import DagDefinitionError, InvalidRequest, ParamsInvalid

WHERE = "dag 'etl'"


def _build(params: dict[str, Any], *, allow_extra: bool = False) -> dict[str, Any]:
    schema = build_params_schema(params, allow_extra=allow_extra, where=WHERE)
    assert schema is not None
    return schema


def _violations(schema: dict[str, Any] | None, conf: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(ParamsInvalid) as info:
        resolve_params("etl", schema, conf)
    return [(v.path, v.message) for v in info.value.violations]


# --- building the schema -------------------------------------------------------------------------------


def test_no_params_means_no_schema() -> None:
    assert build_params_schema(None, allow_extra=False, where=WHERE) is None
    assert build_params_schema({}, allow_extra=True, where=WHERE) is None


def test_plain_values_infer_their_type() -> None:
    schema = _build(
        {"flag": True, "n": 3, "ratio": 0.5, "name": "x", "tags": ["a"], "opts": {"k": 1}, "anything": None}
    )
    props = schema["properties"]
    assert props["flag"] == {"type": "boolean", "default": True}
    assert props["n"] == {"type": "integer", "default": 3}
    assert props["ratio"] == {"type": "number", "default": 0.5}
    assert props["name"] == {"type": "string", "default": "x"}
    assert props["tags"] == {"type": "array", "default": ["a"]}
    assert props["opts"] == {"type": "object", "default": {"k": 1}}
    assert props["anything"] == {"default": None}
    assert schema["required"] == []


def test_schema_envelope() -> None:
    schema = _build({"b": Param(type="string"), "a": Param(type="integer"), "c": 1})
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["type"] == "object"
    assert schema["required"] == ["a", "b"]
    assert schema["additionalProperties"] is False
    assert _build({"a": 1}, allow_extra=True)["additionalProperties"] is True


def test_param_keywords_description_and_title() -> None:
    p = Param(
        5, type="integer", minimum=1, maximum=10, description="How many rows.", title="Limit", multiple_of=5
    )
    assert p.schema() == {
        "type": "integer",
        "minimum": 1,
        "maximum": 10,
        "multipleOf": 5,
        "default": 5,
        "description": "How many rows.",
        "title": "Limit",
    }
    assert not p.required
    assert p.default == 5


def test_param_enum_pattern_items_and_aliases() -> None:
    regions = Param(["eu"], type="array", items={"enum": ["eu", "us"]}, min_items=1, unique_items=True)
    assert regions.schema() == {
        "type": "array",
        "items": {"enum": ["eu", "us"]},
        "minItems": 1,
        "uniqueItems": True,
        "default": ["eu"],
    }
    code = Param(type="string", pattern="^[A-Z]{2}$", min_length=2, max_length=2)
    assert code.schema() == {"type": "string", "pattern": "^[A-Z]{2}$", "minLength": 2, "maxLength": 2}
    assert code.required
    assert code.default is NOTSET
    mode = Param("fast", enum=("fast", "slow"))  # tuples become JSON arrays
    assert mode.schema() == {"enum": ["fast", "slow"], "default": "fast"}


def test_param_schema_is_a_copy() -> None:
    p = Param({"a": [1]}, type="object")
    p.schema()["default"]["a"].append(2)
    p.default["a"].append(3)
    assert p.schema()["default"] == {"a": [1]}


def test_param_normalizes_enum_subclasses_to_plain_json() -> None:
    class Color(str, enum.Enum):  # noqa: UP042 - a str mixin, whose str() is not its value
        RED = "red"

    p = Param(Color.RED, enum=[Color.RED, "blue"])
    assert p.schema() == {"enum": ["red", "blue"], "default": "red"}
    assert type(p.schema()["default"]) is str


def test_unknown_keyword_is_named_with_the_allowed_ones() -> None:
    with pytest.raises(DagDefinitionError) as info:
        Param(3, minumum=1)
    message = str(info.value)
    assert "'minumum'" in message
    assert "did you mean 'minimum'" in message
    assert "exclusiveMinimum" in message and "pattern" in message


def test_keyword_given_under_both_spellings() -> None:
    with pytest.raises(DagDefinitionError, match="'min_length' and 'minLength'"):
        Param(min_length=1, minLength=2)


def test_python_type_instead_of_json_type_name() -> None:
    with pytest.raises(DagDefinitionError, match="type='integer'"):
        Param(type=int)
    with pytest.raises(DagDefinitionError, match="not a JSON Schema type"):
        Param(type="int")
    assert Param(None, type=["integer", "null"]).schema()["type"] == ["integer", "null"]


@pytest.mark.parametrize(
    ("default", "needle"),
    [(object(), "object value"), (float("nan"), "finite"), ({1: "x"}, "not a string"), ([{2.0, 1.0}], "set")],
)
def test_default_must_be_json(default: Any, needle: str) -> None:
    with pytest.raises(DagDefinitionError, match=needle):
        Param(default)


def test_plain_value_that_is_not_json_names_the_dag_and_param() -> None:
    with pytest.raises(DagDefinitionError) as info:
        build_params_schema({"when": object()}, allow_extra=False, where=WHERE)
    assert str(info.value).startswith("dag 'etl': param 'when':")


def test_default_violating_its_own_schema() -> None:
    with pytest.raises(DagDefinitionError) as info:
        build_params_schema({"limit": Param(0, type="integer", minimum=1)}, allow_extra=False, where=WHERE)
    message = str(info.value)
    assert message.startswith("dag 'etl': ")
    assert "default of param 'limit'" in message
    assert "0 is less than the minimum of 1" in message


def test_nested_default_violation_names_its_path() -> None:
    bad = Param([1, "x"], type="array", items={"type": "integer"})
    with pytest.raises(DagDefinitionError, match=r"param 'ids' .* at \$\[1\]: 'x' is not of type 'integer'"):
        build_params_schema({"ids": bad}, allow_extra=False, where=WHERE)


@pytest.mark.parametrize(
    ("param", "needle"),
    [
        (Param(type="string", pattern="["), "(param 'code', keyword 'pattern')"),
        (Param(minimum="one"), "(param 'code', keyword 'minimum')"),
        (Param(min_length=-1), "(param 'code', keyword 'minLength')"),
    ],
)
def test_invalid_schema_keyword_value(param: Param, needle: str) -> None:
    with pytest.raises(DagDefinitionError) as info:
        build_params_schema({"code": param}, allow_extra=False, where=WHERE)
    assert str(info.value).startswith("dag 'etl': invalid params schema")
    assert needle in str(info.value)


@pytest.mark.parametrize("key", ["1st", "has-dash", "has space", "", "x" * 101, "ok\n", "ünï"])
def test_bad_param_names(key: str) -> None:
    with pytest.raises(DagDefinitionError) as info:
        build_params_schema({key: 1}, allow_extra=False, where=WHERE)
    assert str(info.value).startswith(f"dag 'etl': invalid param name {key!r}")


def test_good_param_names() -> None:
    schema = _build({"_x": 1, "X9": 1, "a" * 100: 1})
    assert sorted(schema["properties"]) == ["X9", "_x", "a" * 100]


def test_params_not_a_mapping() -> None:
    with pytest.raises(DagDefinitionError, match="must be a mapping"):
        build_params_schema(["limit"], allow_extra=False, where=WHERE)  # type: ignore[arg-type]


# --- check_schema directly -------------------------------------------------------------------------------


def test_check_schema_raises_value_error() -> None:
    with pytest.raises(ValueError, match="invalid params schema"):
        check_schema({"type": "no-such-type"})
    with pytest.raises(ValueError, match="default of param 'a'"):
        check_schema({"type": "object", "properties": {"a": {"type": "string", "default": 1}}})
    check_schema({"type": "object", "properties": {"a": {"type": "string", "default": "x"}, "b": True}})


def test_check_schema_checks_formats_of_defaults() -> None:
    with pytest.raises(ValueError, match="is not a 'date'"):
        check_schema({"type": "object", "properties": {"d": {"format": "date", "default": "2024-02-30"}}})


# --- resolving a conf ------------------------------------------------------------------------------------


@pytest.fixture
def etl_schema() -> dict[str, Any]:
    return _build(
        {
            "date": Param(type="string", format="date", description="Business date."),
            "limit": Param(10, type="integer", minimum=1),
            "mode": Param("fast", enum=["fast", "slow"]),
            "regions": Param(["eu"], type="array", items={"enum": ["eu", "us"]}),
            "filters": Param(
                {"country": "SE"},
                type="object",
                properties={
                    "country": {"type": "string", "pattern": "^[A-Z]{2}$"},
                    "city": {"type": "string"},
                },
                required=["country"],
                additional_properties=False,
            ),
            "dry_run": False,
        }
    )


def test_defaults_applied(etl_schema: dict[str, Any]) -> None:
    resolved = resolve_params("etl", etl_schema, {"date": "2024-05-01", "limit": 3})
    assert resolved == {
        "date": "2024-05-01",
        "limit": 3,
        "mode": "fast",
        "regions": ["eu"],
        "filters": {"country": "SE"},
        "dry_run": False,
    }


def test_defaults_are_deep_copies_and_inputs_are_not_mutated(etl_schema: dict[str, Any]) -> None:
    schema_before = copy.deepcopy(etl_schema)
    conf = {"date": "2024-05-01", "mode": "slow", "regions": ["us"]}
    conf_before = copy.deepcopy(conf)
    resolved = resolve_params("etl", etl_schema, conf)
    resolved["regions"].append("eu")  # came from the conf
    resolved["filters"]["city"] = "Malmo"  # came from a default
    assert etl_schema == schema_before
    assert conf == conf_before
    again = resolve_params("etl", etl_schema, {"date": "2024-05-01"})
    assert again["filters"] == {"country": "SE"}


def test_explicit_values_win_over_defaults(etl_schema: dict[str, Any]) -> None:
    resolved = resolve_params("etl", etl_schema, {"date": "2024-05-01", "regions": ["us"], "dry_run": True})
    assert resolved["regions"] == ["us"]
    assert resolved["dry_run"] is True


def test_every_violation_reported_with_exact_path_in_stable_order(etl_schema: dict[str, Any]) -> None:
    conf = {
        "limit": -3,
        "mode": "turbo",
        "regions": ["eu", "us", "eu-north"],
        "filters": {"country": "sweden", "zip": "123"},
        "dry_run": "yes",
        "limt": 5,
    }
    expected = [
        ("$.date", "missing required param 'date'"),
        ("$.dry_run", "'yes' is not of type 'boolean'"),
        ("$.filters.country", "'sweden' does not match '^[A-Z]{2}$'"),
        ("$.filters.zip", "unknown key 'zip' (the object at $.filters accepts: city, country)"),
        ("$.limit", "-3 is less than the minimum of 1"),
        ("$.limt", "unknown key 'limt' (the DAG accepts: date, dry_run, filters, limit, mode, regions)"),
        ("$.mode", "'turbo' is not one of ['fast', 'slow']"),
        ("$.regions[2]", "'eu-north' is not one of ['eu', 'us']"),
    ]
    assert _violations(etl_schema, conf) == expected
    # Same conf with the keys in another order: same report.
    assert _violations(etl_schema, dict(reversed(list(conf.items())))) == expected


def test_nested_required_and_wrong_type(etl_schema: dict[str, Any]) -> None:
    found = _violations(etl_schema, {"date": "2024-05-01", "filters": {"city": 7}, "limit": "10"})
    assert found == [
        ("$.filters.city", "7 is not of type 'string'"),
        ("$.filters.country", "missing required key 'country'"),
        ("$.limit", "'10' is not of type 'integer'"),
    ]


def test_array_indexes_sort_numerically() -> None:
    schema = _build({"ids": Param(type="array", items={"type": "integer"})})
    found = _violations(schema, {"ids": [0, "a", 2, 3, 4, 5, 6, 7, 8, 9, "b"]})
    assert [path for path, _ in found] == ["$.ids[1]", "$.ids[10]"]


def test_several_unknown_keys_one_violation_each() -> None:
    schema = _build({"limit": 1})
    assert _violations(schema, {"b": 1, "a": 2}) == [
        ("$.a", "unknown key 'a' (the DAG accepts: limit)"),
        ("$.b", "unknown key 'b' (the DAG accepts: limit)"),
    ]


def test_odd_unknown_key_is_quoted_in_the_path() -> None:
    schema = _build({"limit": 1})
    assert _violations(schema, {"my key": 1}) == [
        ('$["my key"]', "unknown key 'my key' (the DAG accepts: limit)")
    ]


def test_format_is_checked(etl_schema: dict[str, Any]) -> None:
    assert _violations(etl_schema, {"date": "2024-13-01"}) == [("$.date", "'2024-13-01' is not a 'date'")]


def test_unknown_keys_accepted_with_allow_extra() -> None:
    schema = _build({"limit": Param(10, type="integer")}, allow_extra=True)
    assert resolve_params("etl", schema, {"other": {"x": 1}}) == {"other": {"x": 1}, "limit": 10}
    assert _violations(schema, {"limit": "x", "other": 1}) == [("$.limit", "'x' is not of type 'integer'")]


def test_no_schema_passes_conf_through() -> None:
    conf = {"anything": [1, 2], "goes": None}
    resolved = resolve_params("etl", None, conf)
    assert resolved == conf
    resolved["anything"].append(3)
    assert conf == {"anything": [1, 2], "goes": None}
    assert resolve_params("etl", None, {}) == {}


def test_conf_that_is_not_an_object() -> None:
    found = _violations(_build({"a": 1}), ["a"])  # type: ignore[arg-type]
    assert found == [("$", "conf must be a JSON object, not list")]


def test_whole_object_violation_has_root_path() -> None:
    schema = _build({"a": 1}, allow_extra=True)
    schema["maxProperties"] = 1
    assert _violations(schema, {"b": 2}) == [("$", "{'b': 2, 'a': 1} has too many properties")]


def test_huge_values_are_clipped_in_messages() -> None:
    schema = _build({"name": Param(type="string")})
    ((path, message),) = _violations(schema, {"name": list(range(10_000))})
    assert path == "$.name"
    assert len(message) <= domain_params.MAX_MESSAGE_CHARS
    assert message.endswith("...")


# --- ParamsInvalid ---------------------------------------------------------------------------------------


def test_params_invalid_message_lists_every_path(etl_schema: dict[str, Any]) -> None:
    with pytest.raises(ParamsInvalid) as info:
        resolve_params("etl", etl_schema, {"limit": 0, "regions": ["xx"], "nope": 1})
    err = info.value
    assert isinstance(err, InvalidRequest)
    assert err.dag_id == "etl"
    lines = str(err).splitlines()
    assert lines[0] == "params of dag 'etl' are invalid (4 problem(s)):"
    assert lines[1:] == [f"  {v.path}: {v.message}" for v in err.violations]
    assert [v.path for v in err.violations] == ["$.date", "$.limit", "$.nope", "$.regions[0]"]


def test_params_invalid_built_directly() -> None:
    err = ParamsInvalid(dag_id="d", violations=[ParamViolation("$.a", "bad")])
    assert str(err) == "params of dag 'd' are invalid (1 problem(s)):\n  $.a: bad"
    assert err.violations == (ParamViolation("$.a", "bad"),)


def test_params_invalid_message_is_capped_but_violations_are_kept() -> None:
    schema = _build({"a": 1})
    conf = {f"k{i:04d}": i for i in range(errors.MAX_LISTED_VIOLATIONS + 5)}
    with pytest.raises(ParamsInvalid) as info:
        resolve_params("etl", schema, conf)
    assert len(info.value.violations) == errors.MAX_LISTED_VIOLATIONS + 5
    assert str(info.value).splitlines()[-1] == "  ... and 5 more"


def test_domain_module_is_pure() -> None:
    text = Path(domain_params.__file__).read_text()
    for forbidden in ("datetime.now", "time.time", "date.today"):
        assert forbidden not in text
