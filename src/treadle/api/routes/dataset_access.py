"""Dataset ownership over HTTP: who owns each dataset, and which other teams may emit to it.

The same use cases as `treadle datasets owner|grant|revoke|access` (engine/dataset_access.py),
each audited there; changes need an admin on every team (`*`) and take effect at the next sync.
The dataset goes in the body, not the path: its name may be a URI (`s3://bucket/key`).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from treadle.api.deps import audit_caller, get_db, require
from treadle.api.guard import API, Caller
from treadle.api.schemas import Identifier, Strict
from treadle.domain.access import Action
from treadle.domain.identifiers import DATASET_NAME
from treadle.engine import dataset_access
from treadle.engine.dataset_access import DatasetAccessRow
from treadle.store.database import Database

router = APIRouter(prefix=API)
Db = Annotated[Database, Depends(get_db)]
DatasetName = Annotated[str, Field(pattern=DATASET_NAME.pattern, max_length=500)]


class DatasetTeam(Strict):
    dataset: DatasetName
    team: Identifier


class OwnerChange(BaseModel):
    dataset: str
    owner: str
    #: The owner before (None: the dataset had none).
    previous: str | None


class GrantChange(BaseModel):
    dataset: str
    team: str
    #: False when nothing changed (already granted, or no grant to revoke).
    changed: bool


@router.get("/dataset-access", response_model=list[DatasetAccessRow])
def list_access(
    db: Db, _caller: Annotated[Caller, require(Action.READ_OPERATIONS)]
) -> list[DatasetAccessRow]:
    """Every dataset with an owner or grants: its owning team and the teams granted to emit to it."""
    return dataset_access.list_dataset_access(db)


@router.put("/dataset-access/owner", response_model=OwnerChange)
def set_owner(
    body: DatasetTeam, db: Db, caller: Annotated[Caller, require(Action.MANAGE_DATASETS)]
) -> OwnerChange:
    """Make a team the owner of a dataset: its DAGs (and granted teams') may emit to it."""
    previous = dataset_access.set_dataset_owner(db, body.dataset, team=body.team, by=audit_caller(caller))
    return OwnerChange(dataset=body.dataset, owner=body.team, previous=previous)


@router.post("/dataset-access/grant", response_model=GrantChange)
def grant(
    body: DatasetTeam, db: Db, caller: Annotated[Caller, require(Action.MANAGE_DATASETS)]
) -> GrantChange:
    """Let DAGs of a team emit to a dataset another team owns (400 if it has no owner yet)."""
    changed = dataset_access.grant_dataset(db, body.dataset, team=body.team, by=audit_caller(caller))
    return GrantChange(dataset=body.dataset, team=body.team, changed=changed)


@router.post("/dataset-access/revoke", response_model=GrantChange)
def revoke(
    body: DatasetTeam, db: Db, caller: Annotated[Caller, require(Action.MANAGE_DATASETS)]
) -> GrantChange:
    """Take back a team's grant; its DAGs emitting to the dataset are refused at the next sync."""
    changed = dataset_access.revoke_dataset(db, body.dataset, team=body.team, by=audit_caller(caller))
    return GrantChange(dataset=body.dataset, team=body.team, changed=changed)
