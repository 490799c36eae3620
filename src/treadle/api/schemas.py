"""Request and response bodies that are not engine records: explicit allow-lists of fields.

Every request model forbids unknown fields (mass assignment, S5) and bounds its sizes (S13).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import Path
from pydantic import BaseModel, ConfigDict, Field

from treadle.domain.access import AuditEntry, Role
from treadle.domain.records import DagInfo, RunInfo
from treadle.domain.task_records import TaskInstanceInfo
from treadle.engine.inspection import Resolution

Identifier = Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]{1,250}$", max_length=250)]
Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]{1,100}$", max_length=100)]
Password = Annotated[str, Field(min_length=1, max_length=1024)]
Reason = Annotated[str, Field(max_length=2000)]
#: Ids in path parameters, bounded by their column (INTEGER / BIGINT): a larger number is a 422
#: naming the parameter, not a database error.
RowId = Annotated[int, Path(ge=1, le=2**31 - 1)]
BigRowId = Annotated[int, Path(ge=1, le=2**63 - 1)]


class Strict(BaseModel):
    """Unknown fields are an error."""

    model_config = ConfigDict(extra="forbid")


class LoginRequest(Strict):
    username: Annotated[str, Field(min_length=1, max_length=100)]
    password: Password


class PasswordChange(Strict):
    current_password: Password
    new_password: Password


class SessionInfo(BaseModel):
    username: str
    csrf_token: str | None
    must_change_password: bool
    grants: dict[str, Role]


class Me(BaseModel):
    username: str
    via: str
    token_id: int | None
    must_change_password: bool
    grants: dict[str, Role]


class NewUser(Strict):
    username: Name
    password: Password
    team: Identifier | None = "default"
    role: Role = Role.VIEWER
    temporary: bool = True


class RoleChange(Strict):
    role: Role


class UserOut(BaseModel):
    username: str
    is_active: bool
    must_change_password: bool
    roles: dict[str, Role]
    created_at: datetime


class NewTeam(Strict):
    name: Identifier
    description: Annotated[str, Field(max_length=2000)] = ""


class TeamOut(BaseModel):
    name: str
    description: str


class NewToken(Strict):
    name: Name
    team: Annotated[str, Field(pattern=r"^([A-Za-z0-9._-]{1,250}|\*)$")] = "default"
    role: Role = Role.VIEWER
    expires_in_days: Annotated[float, Field(gt=0, le=3650)] | None = None


class TokenOut(BaseModel):
    id: int
    name: str
    username: str
    team: str
    role: Role
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None


class CreatedToken(TokenOut):
    #: Shown this once; only its hash is stored.
    token: str


class TriggerRequest(Strict):
    conf: dict[str, Any] = Field(default_factory=dict)  # Any: the run's params, checked by the DAG's schema


class CancelRequest(Strict):
    reason: Reason = ""
    task_id: Identifier | None = None


class ClearRequest(Strict):
    task_ids: Annotated[list[Identifier], Field(max_length=10_000)] | None = None
    downstream: bool = False
    only_failed: bool = False
    reason: Reason = ""


class ResolveRequest(Strict):
    resolution: Resolution
    reason: Annotated[str, Field(min_length=1, max_length=2000)]


class PoolRequest(Strict):
    slots: Annotated[int, Field(ge=0, le=1_000_000)]
    description: Annotated[str, Field(max_length=2000)] | None = None


class Page(BaseModel):
    #: Pass as `cursor` for the next (older) page; None on the last page.
    next_cursor: str | None


class Check(BaseModel):
    name: str
    ok: bool
    detail: str


class Health(BaseModel):
    status: str
    checks: list[Check]


class ScheduleOut(BaseModel):
    spec: dict[str, Any]  # Any: the stored schedule spec
    description: str
    last_fire_at: datetime | None
    next_fire_at: datetime | None
    next_fires: list[datetime]


class DagDetail(BaseModel):
    dag: DagInfo
    structure: dict[str, Any]  # Any: the serialized DAG version
    schedule: ScheduleOut | None


class RunPage(Page):
    runs: list[RunInfo]


class AuditPage(Page):
    entries: list[AuditEntry]


class RequeueResult(BaseModel):
    requeued: list[TaskInstanceInfo]
    #: (task instance id, why it was not requeued)
    refused: list[tuple[int, str]] = Field(default_factory=list)
