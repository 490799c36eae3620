"""DAG params: check a params JSON Schema; resolve a trigger's conf against it (defaults, then
validation by the schema and the DAG's cross-field rules)."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError

from treadle.domain.param_rules import ParamRule, check_rules
from treadle.domain.secret_params import is_secret_path
from treadle.errors import ParamsInvalid

#: JSON Schema dialect of every params schema.
DIALECT = "https://json-schema.org/draft/2020-12/schema"

#: Longest violation message kept; longer ones (a huge value echoed back) are cut.
MAX_MESSAGE_CHARS = 300

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_PathPart = str | int


@dataclass(frozen=True, slots=True)
class ParamViolation:
    """One way a trigger's conf breaks the DAG's params schema."""

    #: JSON path of the offending value: "$" (the whole object), "$.limit", "$.regions[2]", "$.filters.city".
    path: str
    #: What is wrong, in plain English.
    message: str


def check_schema(schema: dict[str, Any]) -> None:
    """Raise ValueError unless `schema` is a valid Draft 2020-12 schema whose property defaults satisfy it."""
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise ValueError(
            f"invalid params schema{_schema_location(exc.absolute_path)}: {exc.message}"
        ) from None
    properties = schema.get("properties") or {}
    for name, prop in properties.items():
        if not isinstance(prop, dict) or "default" not in prop:
            continue
        validator = Draft202012Validator(prop, format_checker=Draft202012Validator.FORMAT_CHECKER)
        error = next(iter(sorted(validator.iter_errors(prop["default"]), key=_error_sort_key)), None)
        if error is not None:
            where = _json_path(error.absolute_path)
            at = "" if where == "$" else f" at {where}"
            raise ValueError(
                f"default of param {name!r} does not satisfy its own schema{at}: {_clip(error.message)}"
            )


def resolve_params(
    dag_id: str,
    schema: dict[str, Any] | None,
    conf: Mapping[str, Any],
    *,
    rules: Sequence[ParamRule] = (),
) -> dict[str, Any]:
    """Return `conf` plus the schema's top-level defaults; raise ParamsInvalid naming every problem.

    The problems are those of the JSON Schema and of the DAG's cross-field `rules`, reported
    together (a rule is not checked on a param the schema already rejected). A DAG without a
    params schema (None) accepts any conf, returned as a copy, still subject to its rules. Inputs
    are never mutated: the result is a deep copy, so changing it changes neither `conf` nor the
    schema's defaults.
    """
    if not isinstance(conf, Mapping):
        raise ParamsInvalid(
            dag_id=dag_id,
            violations=[ParamViolation("$", f"conf must be a JSON object, not {_type_name(conf)}")],
        )
    merged = copy.deepcopy(dict(conf))
    found: dict[tuple[tuple[tuple[int, int, str], ...], str], ParamViolation] = {}
    rejected: set[str] = set()
    if schema is not None:
        properties = schema.get("properties") or {}
        for name, prop in properties.items():
            if name not in merged and isinstance(prop, dict) and "default" in prop:
                merged[name] = copy.deepcopy(prop["default"])
        validator = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
        for error in validator.iter_errors(merged):
            for parts, message in _explain(error):
                if error.validator != "required" and is_secret_path(schema, parts):
                    # jsonschema's messages quote the value; errors reach logs and terminals.
                    message = (
                        f"does not satisfy {error.validator!r} (the value of a secret param is not shown)"
                    )
                violation = ParamViolation(_json_path(parts), _clip(message))
                found.setdefault((_parts_key(parts), violation.message), violation)
                if parts and isinstance(parts[0], str):
                    rejected.add(parts[0])
    if rules:
        hidden = frozenset(n for rule in rules for n in rule.names() if is_secret_path(schema, (n,)))
        for name, message in check_rules(tuple(rules), merged, hidden=hidden, rejected=frozenset(rejected)):
            violation = ParamViolation(_json_path((name,)), _clip(message))
            found.setdefault((_parts_key((name,)), violation.message), violation)
    if found:
        raise ParamsInvalid(dag_id=dag_id, violations=[found[key] for key in sorted(found)])
    return merged


def _explain(error: ValidationError) -> list[tuple[tuple[_PathPart, ...], str]]:
    """Turn one jsonschema error into (path parts, message) pairs: one per unknown or missing key."""
    base = tuple(error.absolute_path)
    instance = error.instance
    if error.validator == "required" and isinstance(instance, dict):
        noun = "param" if not base else "key"
        names = error.validator_value if isinstance(error.validator_value, list) else []
        missing = [k for k in names if isinstance(k, str) and k not in instance]
        return [((*base, key), f"missing required {noun} {key!r}") for key in missing]
    if (
        error.validator == "additionalProperties"
        and error.validator_value is False
        and isinstance(instance, dict)
        and isinstance(error.schema, dict)
    ):
        accepted = sorted((error.schema.get("properties") or {}).keys())
        patterns = list((error.schema.get("patternProperties") or {}).keys())
        unknown = [k for k in instance if k not in accepted and not any(re.search(p, k) for p in patterns)]
        owner = "the DAG" if not base else f"the object at {_json_path(base)}"
        if accepted:
            accepts = f"{owner} accepts: {', '.join(accepted)}"
        else:
            accepts = f"{owner} accepts no {'params' if not base else 'keys'}"
        return [((*base, key), f"unknown key {key!r} ({accepts})") for key in unknown]
    return [(base, error.message)]


def _json_path(parts: Iterable[_PathPart]) -> str:
    """Render path parts as a JSON path: `$`, `$.limit`, `$.regions[2]`, `$["odd key"]`."""
    out = ["$"]
    for part in parts:
        if isinstance(part, int):
            out.append(f"[{part}]")
        elif _IDENTIFIER.fullmatch(part):
            out.append(f".{part}")
        else:
            out.append(f"[{json.dumps(part)}]")
    return "".join(out)


def _parts_key(parts: Iterable[_PathPart]) -> tuple[tuple[int, int, str], ...]:
    """A sort key for path parts that orders array indexes numerically and never compares int with str."""
    return tuple((0, part, "") if isinstance(part, int) else (1, 0, part) for part in parts)


def _error_sort_key(error: ValidationError) -> tuple[tuple[tuple[int, int, str], ...], str]:
    return _parts_key(error.absolute_path), error.message


def _schema_location(parts: Iterable[_PathPart]) -> str:
    """Name where in a params schema a problem is: ` (param 'limit', keyword 'minimum')` or ` at $.x`."""
    parts = list(parts)
    if len(parts) >= 2 and parts[0] == "properties":
        name, rest = parts[1], parts[2:]
        keyword = f", keyword {rest[0]!r}" if rest else ""
        return f" (param {name!r}{keyword})"
    return "" if not parts else f" at {_json_path(parts)}"


def _clip(message: str) -> str:
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    return message[: MAX_MESSAGE_CHARS - 3] + "..."


def _type_name(value: object) -> str:
    return type(value).__name__
