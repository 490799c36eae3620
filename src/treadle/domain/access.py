"""Who may do what: roles, actions and the one authorization decision (pure, no I/O).

A principal holds grants: a role per team, where the team `*` (ALL_TEAMS) stands for every
team. An action names the least role it needs and whether it acts inside one team (a DAG's
runs, its dead letters) or on the deployment as a whole (pools, users, the audit log), which
only a grant on `*` can allow.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import Enum, StrEnum
from typing import Any

#: The team name that stands for every team in a grant.
ALL_TEAMS = "*"


class Role(StrEnum):
    """A role held in a team; each includes the powers of the ones below it."""

    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"

    @property
    def rank(self) -> int:
        """0 for viewer, 1 for operator, 2 for admin."""
        return _RANKS[self]

    def includes(self, other: Role) -> bool:
        """True if this role may do everything `other` may."""
        return self.rank >= other.rank


_RANKS = {Role.VIEWER: 0, Role.OPERATOR: 1, Role.ADMIN: 2}


class Scope(StrEnum):
    """Where an action applies."""

    #: Inside the team that owns the object (a DAG and everything of its runs).
    TEAM = "team"
    #: Listing across teams: allowed with the role in any team; results are filtered by team.
    ANY_TEAM = "any_team"
    #: The deployment as a whole: needs the role on `*`.
    GLOBAL = "global"
    #: The caller's own account (password, own tokens): any signed-in principal.
    SELF = "self"


class Action(Enum):
    """Every action the API authorizes, with the least role it needs and its scope."""

    READ_DAGS = (Role.VIEWER, Scope.ANY_TEAM)
    READ_DAG = (Role.VIEWER, Scope.TEAM)
    PAUSE_DAG = (Role.OPERATOR, Scope.TEAM)
    TRIGGER_RUN = (Role.OPERATOR, Scope.TEAM)
    CANCEL_RUN = (Role.OPERATOR, Scope.TEAM)
    CLEAR_TASKS = (Role.OPERATOR, Scope.TEAM)
    REQUEUE_DEAD_LETTER = (Role.OPERATOR, Scope.TEAM)
    RESOLVE_INSPECTION = (Role.OPERATOR, Scope.TEAM)
    RUN_BACKFILL = (Role.OPERATOR, Scope.TEAM)
    READ_LOAD_ERRORS = (Role.VIEWER, Scope.GLOBAL)
    READ_OPERATIONS = (Role.VIEWER, Scope.ANY_TEAM)
    #: /metrics: its labels name every team's DAGs and tasks.
    READ_METRICS = (Role.VIEWER, Scope.GLOBAL)
    WRITE_POOLS = (Role.OPERATOR, Scope.GLOBAL)
    #: Dataset owners and grants decide what every team's DAGs may emit to.
    MANAGE_DATASETS = (Role.ADMIN, Scope.GLOBAL)
    READ_AUDIT = (Role.ADMIN, Scope.GLOBAL)
    MANAGE_USERS = (Role.ADMIN, Scope.GLOBAL)
    OWN_ACCOUNT = (Role.VIEWER, Scope.SELF)

    _least_role: Role
    _scope: Scope

    def __new__(cls, role: Role, scope: Scope) -> Action:
        # Numbered, not valued by (role, scope): actions needing the same role in the same scope
        # (READ_AUDIT, MANAGE_USERS, MANAGE_DATASETS) stay distinct members instead of aliases
        # of the first, so each denial names the action refused.
        member = object.__new__(cls)
        member._value_ = len(cls.__members__) + 1
        member._least_role = role
        member._scope = scope
        return member

    @property
    def role(self) -> Role:
        """The least role the action needs."""
        return self._least_role

    @property
    def scope(self) -> Scope:
        """Where the action applies."""
        return self._scope


@dataclass(frozen=True, slots=True, kw_only=True)
class Principal:
    """Who is calling: a user through a session or a token, with the grants in force."""

    user_id: int
    username: str
    #: team -> role; for a token, only its one team at the lesser of its role and the user's.
    grants: dict[str, Role]
    #: The token's id when the call carries an API token, else None (a browser session).
    token_id: int | None = None
    must_change_password: bool = False

    @property
    def actor(self) -> str:
        """How the audit log names the caller: `user:<name>` or `token:<id>:<name>`."""
        if self.token_id is not None:
            return f"token:{self.token_id}:{self.username}"
        return f"user:{self.username}"

    def role_in(self, team: str) -> Role | None:
        """The strongest role the principal holds in `team` (a grant on `*` counts)."""
        held = [r for t, r in self.grants.items() if t in (team, ALL_TEAMS)]
        return max(held, key=lambda r: r.rank) if held else None

    def teams_with(self, role: Role) -> frozenset[str] | None:
        """Teams where the principal holds at least `role`; None means every team."""
        if (all_role := self.grants.get(ALL_TEAMS)) is not None and all_role.includes(role):
            return None
        return frozenset(t for t, r in self.grants.items() if r.includes(role))


def is_allowed(principal: Principal, action: Action, *, team: str | None = None) -> bool:
    """The authorization decision: may `principal` do `action` (on an object of `team`)?

    TEAM actions need `team`; without one they are refused (deny by default).
    """
    need = action.role
    if action.scope is Scope.SELF:
        return True
    if action.scope is Scope.GLOBAL:
        held = principal.grants.get(ALL_TEAMS)
        return held is not None and held.includes(need)
    if action.scope is Scope.ANY_TEAM:
        return any(r.includes(need) for r in principal.grants.values())
    if team is None:
        return False
    held_in_team = principal.role_in(team)
    return held_in_team is not None and held_in_team.includes(need)


def token_grants(user_grants: dict[str, Role], *, team: str, role: Role) -> dict[str, Role]:
    """The grants a token carries: its team at the lesser of its role and its user's role now.

    A user demoted after making a token does not keep the old powers through it.
    """
    held = [r for t, r in user_grants.items() if t in (team, ALL_TEAMS)]
    if not held:
        return {}
    best = max(held, key=lambda r: r.rank)
    return {team: role if best.includes(role) else best}


@dataclass(frozen=True, slots=True, kw_only=True)
class UserRecord:
    """A stored user (the password hash never leaves the engine)."""

    id: int
    username: str
    password_hash: str
    is_active: bool
    must_change_password: bool
    session_version: int
    created_at: datetime
    #: team -> role.
    memberships: dict[str, Role]


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenRecord:
    """A stored API token (its secret is never stored, only a hash of it)."""

    id: int
    name: str
    user_id: int
    username: str
    team: str
    role: Role
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None

    def is_usable(self, now: datetime) -> bool:
        """Not revoked and not expired at `now`."""
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > now)


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditEntry:
    """One audit log entry."""

    id: int
    at: datetime
    actor: str
    action: str
    target: str
    details: dict[str, Any]  # Any: the JSON parameters of the action
    address: str | None


#: Parameter names whose values never reach the audit log or a response (S8).
_SECRET_WORDS = ("password", "secret", "token", "key", "cookie", "authorization")
REDACTED = "***"


def redact_secrets(details: Any) -> Any:  # Any: JSON in, the same JSON with secrets masked out
    """A copy of JSON `details` with every value under a secret-sounding key replaced by `***`."""
    if isinstance(details, dict):
        return {
            k: REDACTED if any(w in str(k).lower() for w in _SECRET_WORDS) else redact_secrets(v)
            for k, v in details.items()
        }
    if isinstance(details, list):
        return [redact_secrets(v) for v in details]
    return details


#: Shortest and longest password accepted.
MIN_PASSWORD_LENGTH = 12
MAX_PASSWORD_LENGTH = 1024


def password_problem(password: str, *, username: str) -> str | None:
    """Why `password` may not be used, or None."""
    if len(password) < MIN_PASSWORD_LENGTH:
        return f"a password must have at least {MIN_PASSWORD_LENGTH} characters"
    if len(password) > MAX_PASSWORD_LENGTH:
        return f"a password may have at most {MAX_PASSWORD_LENGTH} characters"
    if password.lower() == username.lower():
        return "a password may not be the user name"
    return None
