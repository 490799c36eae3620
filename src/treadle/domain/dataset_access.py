"""Which team may emit to which dataset (pure): its owner, and the teams it is granted to.

A DAG may only emit outlets to datasets its team owns or is granted. A dataset nobody owns yet
is claimed by the first team whose DAG emits to it (DAGs taken in id order within one sync), so
an install that never set an owner keeps working and every dataset gets one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from treadle.domain.dag_version import DagStructure


@dataclass(frozen=True, slots=True, kw_only=True)
class OutletRefusal:
    """A dataset a DAG emits to that its team may not."""

    dataset: str
    owner: str


@dataclass(frozen=True, slots=True, kw_only=True)
class OutletDecision:
    """What a sync does about the outlets of the DAGs it registers."""

    #: dataset -> team: datasets without an owner, claimed by the team of the first DAG emitting them.
    claims: dict[str, str] = field(default_factory=dict)
    #: dag_id -> the datasets it may not emit to (the DAG is refused: not registered).
    refused: dict[str, list[OutletRefusal]] = field(default_factory=dict)


def may_emit(team: str, dataset: str, *, owner: str | None, granted: frozenset[str]) -> bool:
    """True when `team` may emit to `dataset` (no owner yet counts: the team would claim it)."""
    return owner is None or owner == team or team in granted


def decide_outlets(
    structures: Sequence[DagStructure],
    *,
    owners: Mapping[str, str],
    grants: Mapping[str, frozenset[str]],
) -> OutletDecision:
    """Refuse each DAG that emits to a dataset its team may not; claim the unowned ones.

    A refused DAG claims nothing. DAGs are taken in id order, so the same sync decides alike.
    """
    decision = OutletDecision()
    for structure in sorted(structures, key=lambda s: s.dag_id):
        team = structure.team
        outlets = structure.outputs()
        refusals = []
        for name in outlets:
            owner = owners.get(name) or decision.claims.get(name)
            if not may_emit(team, name, owner=owner, granted=grants.get(name, frozenset())):
                assert owner is not None
                refusals.append(OutletRefusal(dataset=name, owner=owner))
        if refusals:
            decision.refused[structure.dag_id] = refusals
            continue
        for name in outlets:
            if name not in owners:
                decision.claims.setdefault(name, team)
    return decision


def describe_refusal(structure: DagStructure, refusals: Sequence[OutletRefusal]) -> str:
    """The load error of a DAG refused for its outlets, naming every dataset, owner and the team."""
    parts = [f"dataset {r.dataset!r} belongs to team {r.owner!r}" for r in refusals]
    first = refusals[0].dataset
    return (
        f"DAG {structure.dag_id!r} of team {structure.team!r} may not emit to datasets its team does "
        f"not own: {'; '.join(parts)}. Have the owner grant them "
        f"(`treadle datasets grant {first} {structure.team}`) or drop the outlets"
    )
