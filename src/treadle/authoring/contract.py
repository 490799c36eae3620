"""A DAG's contract and params rules as authors write them, checked into their stored form."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from treadle.authoring.datasets import Dataset, dataset_names
from treadle.domain.alerts import AlertRule
from treadle.domain.contract import DagContract
from treadle.domain.dag_version import DagStructure
from treadle.domain.durations import parse_duration
from treadle.domain.param_rules import ParamRule
from treadle.domain.params import resolve_params
from treadle.errors import DagDefinitionError, InvalidRequest, ParamsInvalid


def build_contract(
    where: str,
    *,
    purpose: str,
    criticality: str | None,
    inlets: Sequence[Dataset | str],
    outlets: Sequence[Dataset | str],
    freshness_slo: timedelta | float | str | None,
    failure_impact: str,
    runbook_url: str | None,
    manual_runs: bool,
    backfills: bool,
    published_by: str | None = None,
    alerts: Sequence[AlertRule] = (),
) -> DagContract:
    """The contract of the DAG `where` names; DagDefinitionError naming the field at fault."""
    names = {"inlets": _names(inlets, "inlets", where), "outlets": _names(outlets, "outlets", where)}
    try:
        return DagContract(
            purpose=purpose,
            criticality=criticality,  # type: ignore[arg-type]  # text, validated into a Criticality
            inlets=names["inlets"],
            outlets=names["outlets"],
            freshness_slo_s=None if freshness_slo is None else _seconds(freshness_slo),
            failure_impact=failure_impact,
            runbook_url=runbook_url,
            manual_runs=manual_runs,
            backfills=backfills,
            published_by=published_by,
            alerts=alerts,  # type: ignore[arg-type]  # a list is checked and made a tuple
            dataset_slos=tuple(
                slo for d in outlets if isinstance(d, Dataset) and (slo := d.slo()) is not None
            ),
        )
    except ValueError as exc:
        raise DagDefinitionError(f"{where}: {exc}") from None


def _names(value: Sequence[Dataset | str], field: str, where: str) -> tuple[str, ...]:
    if isinstance(value, str | Dataset) or not isinstance(value, list | tuple):
        raise DagDefinitionError(f"{where}: {field} must be a list of Dataset, got {value!r}")
    try:
        return dataset_names(value, f"{where}: {field}")
    except DagDefinitionError as exc:
        text = str(exc)
        raise DagDefinitionError(text if text.startswith(where) else f"{where}: {field}: {text}") from None


def _seconds(value: timedelta | float | str) -> float:
    """A freshness SLO in seconds: a timedelta, a number of seconds or text such as "6h"."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, str):
        try:
            return parse_duration(value).total_seconds()
        except InvalidRequest as exc:
            raise ValueError(f"freshness_slo: {exc}") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"freshness_slo must be a timedelta, seconds or text such as '6h', got {value!r}")
    return float(value)


def check_param_rules(
    rules: Sequence[ParamRule], schema: dict[str, Any] | None, where: str
) -> tuple[ParamRule, ...]:
    """The rules as stored; DagDefinitionError for a rule that is not a ParamRule or names a
    param the DAG does not accept."""
    if isinstance(rules, ParamRule) or not isinstance(rules, list | tuple):
        raise DagDefinitionError(f"{where}: param_rules must be a list of ParamRule, got {rules!r}")
    for rule in rules:
        if not isinstance(rule, ParamRule):
            raise DagDefinitionError(f"{where}: param_rules must hold ParamRule objects, got {rule!r}")
        if schema is None or schema.get("additionalProperties") is not False:
            continue
        declared = schema.get("properties") or {}
        unknown = [n for n in rule.names() if n not in declared]
        if unknown:
            accepted = ", ".join(sorted(declared)) or "none"
            raise DagDefinitionError(
                f"{where}: param rule {rule.describe()!r} names {', '.join(map(repr, unknown))}, "
                f"which is not a param of this DAG (params: {accepted})"
            )
    return tuple(rules)


def check_structure_contract(structure: DagStructure, where: str) -> None:
    """What can be checked only once the tasks are placed: a freshness objective needs outputs,
    and the runs a schedule starts (with the params' defaults) must satisfy the param rules."""
    if structure.contract.freshness_slo_s is not None and not structure.outputs():
        raise DagDefinitionError(
            f"{where}: freshness_slo applies to the DAG's outputs, and it has none: "
            "declare outlets= on the DAG or on the tasks that write them"
        )
    if structure.contract.published_by is not None and not structure.outputs():
        raise DagDefinitionError(
            f"{where}: published_by applies to the DAG's outputs, and it has none: "
            "declare outlets= on the DAG or on the tasks that write them"
        )
    for rule in structure.contract.alerts:
        unknown = [t for t in rule.tasks if t not in structure.tasks]
        if unknown:
            raise DagDefinitionError(
                f"{where}: alert {rule.kind.value} names task(s) {', '.join(map(repr, unknown))}, "
                f"which the DAG does not have (tasks: {', '.join(sorted(structure.tasks))})"
            )
    if structure.schedule is None or not structure.param_rules:
        return
    try:
        resolve_params(structure.dag_id, structure.params_schema, {}, rules=structure.param_rules)
    except ParamsInvalid as exc:
        raise DagDefinitionError(
            f"{where}: scheduled runs take the params' defaults, which break its rules: {exc}"
        ) from None
