"""DAG params as authors declare them: `Param` objects or plain JSON defaults, built into one JSON Schema."""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping
from typing import Any, Final

from treadle.domain.param_rules import ParamRule
from treadle.domain.params import DIALECT, check_schema
from treadle.errors import DagDefinitionError

__all__ = ["NOTSET", "Param", "ParamRule", "build_params_schema"]

#: JSON Schema keywords a Param accepts.
SCHEMA_KEYWORDS: Final = frozenset(
    {
        "type",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "enum",
        "const",
        "pattern",
        "minLength",
        "maxLength",
        "items",
        "minItems",
        "maxItems",
        "uniqueItems",
        "properties",
        "required",
        "additionalProperties",
        "format",
        "multipleOf",
        "anyOf",
        "oneOf",
        "examples",
        "writeOnly",
    }
)

#: Python-style spellings accepted for JSON Schema keywords.
KEYWORD_ALIASES: Final = {
    "min_length": "minLength",
    "max_length": "maxLength",
    "min_items": "minItems",
    "max_items": "maxItems",
    "unique_items": "uniqueItems",
    "exclusive_minimum": "exclusiveMinimum",
    "exclusive_maximum": "exclusiveMaximum",
    "multiple_of": "multipleOf",
    "additional_properties": "additionalProperties",
}

#: The type names JSON Schema knows.
JSON_TYPES: Final = ("array", "boolean", "integer", "null", "number", "object", "string")

_PY_TYPES: Final[dict[type, str]] = {
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    list: "array",
    tuple: "array",
    dict: "object",
    type(None): "null",
}

_PARAM_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")


class _NotSet:
    """Type of NOTSET."""

    _instance: _NotSet | None = None

    def __new__(cls) -> _NotSet:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NOTSET"


#: The default of a Param that has none: the param is required.
NOTSET: Final = _NotSet()


class Param:
    """One DAG parameter: a default plus JSON Schema keywords."""

    __slots__ = ("_default", "_description", "_keywords", "_title")

    def __init__(
        self,
        default: Any = NOTSET,
        *,
        description: str | None = None,
        title: str | None = None,
        **schema: Any,
    ) -> None:
        for label, text in (("description", description), ("title", title)):
            if text is not None and not isinstance(text, str):
                raise DagDefinitionError(f"Param {label} must be a string, not {type(text).__name__}")
        self._keywords = _keywords(schema)
        self._default = default if default is NOTSET else _to_json(default, "default")
        self._description = description
        self._title = title

    @property
    def default(self) -> Any:
        """The default value (a copy), or NOTSET when the param is required."""
        return self._default if self._default is NOTSET else _to_json(self._default, "default")

    @property
    def required(self) -> bool:
        """True when the param has no default, so every trigger must supply it."""
        return self._default is NOTSET

    def schema(self) -> dict[str, Any]:
        """Return the property schema: the keywords, plus "default", "description" and "title" when set."""
        out: dict[str, Any] = _to_json(self._keywords, "schema")
        if self._default is not NOTSET:
            out["default"] = _to_json(self._default, "default")
        if self._description is not None:
            out["description"] = self._description
        if self._title is not None:
            out["title"] = self._title
        return out

    def __repr__(self) -> str:
        fields = [] if self._default is NOTSET else [repr(self._default)]
        fields += [f"{k}={v!r}" for k, v in self._keywords.items()]
        if self._description is not None:
            fields.append(f"description={self._description!r}")
        if self._title is not None:
            fields.append(f"title={self._title!r}")
        return f"Param({', '.join(fields)})"


def build_params_schema(
    params: Mapping[str, Any] | None, *, allow_extra: bool, where: str
) -> dict[str, Any] | None:
    """Build the params JSON Schema of a DAG, or None when it declares no params.

    Each value is a Param, or a plain JSON value meaning a Param with that default and its type inferred.
    `where` names the DAG in errors, e.g. "dag 'etl'".
    """
    if params is None:
        return None
    if not isinstance(params, Mapping):
        raise DagDefinitionError(
            f"{where}: params must be a mapping of name to Param, not {type(params).__name__}"
        )
    if not params:
        return None
    properties: dict[str, Any] = {}
    required: list[str] = []
    for key, value in params.items():
        if not isinstance(key, str) or not _PARAM_NAME.fullmatch(key):
            raise DagDefinitionError(
                f"{where}: invalid param name {key!r}: a name is 1-100 letters, digits or underscores, "
                "not starting with a digit"
            )
        param = value if isinstance(value, Param) else _plain_param(value, key, where)
        properties[key] = param.schema()
        if param.required:
            required.append(key)
    schema: dict[str, Any] = {
        "$schema": DIALECT,
        "type": "object",
        "properties": properties,
        "required": sorted(required),
        "additionalProperties": allow_extra,
    }
    try:
        check_schema(schema)
    except ValueError as exc:
        raise DagDefinitionError(f"{where}: {exc}") from None
    return schema


def _plain_param(value: Any, key: str, where: str) -> Param:
    """The Param a plain default stands for: that default, with its JSON type inferred."""
    inferred = _infer_type(value)
    try:
        return Param(value) if inferred is None else Param(value, type=inferred)
    except DagDefinitionError as exc:
        raise DagDefinitionError(f"{where}: param {key!r}: {exc}") from None


def _infer_type(value: Any) -> str | None:
    if value is None:
        return None
    for py_type, name in (
        (bool, "boolean"),
        (int, "integer"),
        (float, "number"),
        (str, "string"),
        ((list, tuple), "array"),
        (Mapping, "object"),
    ):
        if isinstance(value, py_type):
            return name
    return None


def _keywords(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Canonical JSON Schema keywords from Param's keyword arguments, checked and made JSON."""
    out: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for given, value in schema.items():
        keyword = KEYWORD_ALIASES.get(given, given)
        if keyword not in SCHEMA_KEYWORDS:
            raise DagDefinitionError(_unknown_keyword(given))
        if keyword in out:
            raise DagDefinitionError(
                f"Param keyword {keyword!r} given twice: as {spelled[keyword]!r} and {given!r}"
            )
        spelled[keyword] = given
        if keyword == "type":
            _check_type(value)
        out[keyword] = _to_json(value, keyword)
    return out


def _unknown_keyword(given: str) -> str:
    known = sorted(SCHEMA_KEYWORDS | KEYWORD_ALIASES.keys())
    close = difflib.get_close_matches(given, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown Param keyword {given!r}{hint}; allowed: {', '.join(sorted(SCHEMA_KEYWORDS))}"


def _check_type(value: Any) -> None:
    names = list(value) if isinstance(value, (list, tuple)) else [value]
    bad = [n for n in names if not isinstance(n, str) or n not in JSON_TYPES]
    if bad or not names:
        hint = ""
        if bad and isinstance(bad[0], type) and bad[0] in _PY_TYPES:
            hint = f" (for {bad[0].__name__} write type={_PY_TYPES[bad[0]]!r})"
        raise DagDefinitionError(
            f"Param type {value!r} is not a JSON Schema type{hint}: use one of {', '.join(JSON_TYPES)} "
            "(or a list of them)"
        )


def _to_json(value: Any, where: str) -> Any:
    """Return a JSON copy of `value` (tuples become lists); raise DagDefinitionError on what is not JSON."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)  # a plain str, also for str-based enums
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise DagDefinitionError(f"Param {where} is not JSON: {value!r} is not a finite number")
        return float(value)
    if isinstance(value, (list, tuple)):
        return [_to_json(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise DagDefinitionError(f"Param {where} is not JSON: key {key!r} is not a string")
            out[key] = _to_json(item, f"{where}.{key}")
        return out
    raise DagDefinitionError(f"Param {where} is not JSON: {type(value).__name__} value {value!r}")
