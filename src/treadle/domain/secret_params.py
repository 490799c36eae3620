"""Secret params: which params a schema marks secret, and their values masked for operators.

A property is secret when its schema says `"writeOnly": true` or `"format": "password"`. Tasks
get the real values; every view for operators (CLI, logs, API) goes through `mask_secrets`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from treadle.domain.records import RunInfo

#: What a secret value is shown as.
MASK = "***"


def params_schema_in(structure: Mapping[str, Any]) -> dict[str, Any] | None:
    """The params schema in a DAG structure's stored JSON form (DagStructure.to_json), read
    without building the structure: views that only mask params import none of its modules."""
    schema = structure.get("params_schema")
    return schema if isinstance(schema, dict) else None


def is_secret(prop: object) -> bool:
    """True if a property schema marks its value secret."""
    return isinstance(prop, Mapping) and (prop.get("writeOnly") is True or prop.get("format") == "password")


def mask_secrets(params: Mapping[str, Any], schema: Mapping[str, Any] | None) -> dict[str, Any]:
    """A copy of `params` with every value the schema marks secret replaced by MASK.

    Nested objects are masked by their own `properties`; a schema of None marks nothing.
    """
    properties = (schema or {}).get("properties") or {}
    masked: dict[str, Any] = {}
    for key, value in params.items():
        prop = properties.get(key)
        if is_secret(prop):
            masked[key] = MASK
        elif isinstance(value, Mapping) and isinstance(prop, Mapping):
            masked[key] = mask_secrets(value, prop)
        else:
            masked[key] = value
    return masked


def is_secret_path(schema: Mapping[str, Any] | None, parts: Sequence[str | int]) -> bool:
    """True if the value at `parts` (JSON path parts from the top of the params) is or lies in a secret."""
    current: object = schema
    for part in parts:
        if not isinstance(current, Mapping) or not isinstance(part, str):
            return False
        current = (current.get("properties") or {}).get(part)
        if is_secret(current):
            return True
    return False


def mask_run(run: RunInfo, schema: Mapping[str, Any] | None) -> RunInfo:
    """The run as operators may see it: secret values masked in its conf, params and manifest."""
    manifest = run.manifest
    if manifest is not None and isinstance(manifest.get("params"), Mapping):
        manifest = {**manifest, "params": mask_secrets(manifest["params"], schema)}
    return dataclasses.replace(
        run,
        conf=mask_secrets(run.conf, schema),
        params=None if run.params is None else mask_secrets(run.params, schema),
        manifest=manifest,
    )
