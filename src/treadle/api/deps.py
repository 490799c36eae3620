"""Request dependencies: the database, the caller, and the permission every route declares.

They do no I/O, so they are `async def`: FastAPI runs a plain `def` dependency on the thread
pool, and each such hop waits for a thread and the GIL, which under load costs more than the
dependency itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import Depends, Request

from treadle.api.guard import Caller
from treadle.api.settings import ApiSettings
from treadle.domain.access import Action, Scope, is_allowed
from treadle.engine.accounts import Caller as AuditCaller
from treadle.errors import NotAuthenticated, PermissionDenied
from treadle.store.database import Database

#: Attribute naming the Action on every permission dependency (the route inventory test reads it).
ACTION_ATTRIBUTE = "treadle_action"


async def get_db(request: Request) -> Database:
    """The API's database."""
    db: Database = request.app.state.db
    return db


async def get_settings(request: Request) -> ApiSettings:
    """The API's settings."""
    settings: ApiSettings = request.app.state.api_settings
    return settings


def get_caller(request: Request) -> Caller:
    """The authenticated caller the guard attached (NotAuthenticated if none: never on a guarded path)."""
    caller: Caller | None = getattr(request.state, "caller", None)
    if caller is None:
        raise NotAuthenticated()
    return caller


def require(action: Action) -> Any:  # Any: a FastAPI Depends marker
    """The dependency a route declares for `action`; refuses early what no team could allow.

    Team actions are decided again, with the object's team, by `authorize` in the route.
    """

    async def permission(request: Request) -> Caller:
        caller = get_caller(request)
        scope_check = Action.READ_DAGS if action.scope is Scope.TEAM else action
        if action.scope is Scope.TEAM:
            allowed = any(r.includes(action.role) for r in caller.principal.grants.values())
        else:
            allowed = is_allowed(caller.principal, scope_check)
        if not allowed:
            raise PermissionDenied(_denial(action, None))
        return caller

    setattr(permission, ACTION_ATTRIBUTE, action)
    return Depends(permission)


def authorize(caller: Caller, action: Action, *, team: str) -> None:
    """Raise PermissionDenied unless the caller may do `action` on an object of `team`."""
    if not is_allowed(caller.principal, action, team=team):
        raise PermissionDenied(_denial(action, team))


def _denial(action: Action, team: str | None) -> str:
    where = {
        Scope.GLOBAL: "on every team (*)",
        Scope.ANY_TEAM: "in some team",
        Scope.SELF: "",
        Scope.TEAM: f"in team {team!r}" if team else "in some team",
    }[action.scope]
    return f"{action.name.lower()} needs the role {action.role.value} {where}".strip()


def audit_caller(caller: Caller) -> AuditCaller:
    """How the engine's audit entries name this caller."""
    return AuditCaller(actor=caller.principal.actor, address=caller.address)


def action_of(dependency: Callable[..., Any]) -> Action | None:
    """The Action a permission dependency stands for (None for other dependencies)."""
    found: Action | None = getattr(dependency, ACTION_ATTRIBUTE, None)
    return found
