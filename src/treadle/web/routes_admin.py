"""Administration pages: users (create, role per team, disable), the caller's API tokens
(create, shown once, revoke) and pools (slots used, queue, size). They call the same engine
functions as the API and the CLI; every form post is audited by the guard, and the engine
records the change itself."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, Response

from treadle.api.deps import audit_caller, get_db, require
from treadle.api.guard import Caller
from treadle.domain.access import ALL_TEAMS, Action, Role, is_allowed
from treadle.engine import accounts, pools
from treadle.errors import AccountNotFound, InvalidRequest, PermissionDenied, TreadleError
from treadle.store.database import Database
from treadle.web.forms import Form, Posted
from treadle.web.render import page, see_other, shown_errors

router = APIRouter(include_in_schema=False)
Db = Annotated[Database, Depends(get_db)]
#: Longest a token made here may live.
MAX_TOKEN_DAYS = 3650
#: What a page says after a change (by the `done` query parameter it was redirected with).
DONE = {
    "created": "User created.",
    "role": "Role changed; the user's sessions have ended.",
    "disabled": "User disabled: their sessions and tokens no longer work.",
    "enabled": "User enabled again.",
    "revoked": "Token revoked.",
    "pool": "Pool saved.",
}
ROLE_CHOICES = [r.value for r in Role]


def _role(form: Form, field: str = "role") -> Role:
    value = form.get(field)
    try:
        return Role(value)
    except ValueError:
        raise InvalidRequest(f"{field}: choose one of {', '.join(ROLE_CHOICES)}, not {value!r}") from None


def _teams(db: Database) -> list[str]:
    """Every team, `default` first and every team at once (`*`) last."""
    return [*(name for name, _ in accounts.list_teams(db)), ALL_TEAMS]


def _users_page(
    request: Request,
    db: Database,
    *,
    error: str = "",
    values: dict[str, str] | None = None,
) -> Response:
    return page(
        request,
        "users.html",
        title="Users",
        users=accounts.list_users(db),
        teams=_teams(db),
        roles=ROLE_CHOICES,
        error=error,
        values=values or {},
        done=DONE.get(request.query_params.get("done", ""), ""),
    )


@router.get("/users", response_class=HTMLResponse)
@shown_errors
def users(request: Request, db: Db, _caller: Annotated[Caller, require(Action.MANAGE_USERS)]) -> Response:
    """Every user with their roles per team, and the forms that change them (admins of every team)."""
    return _users_page(request, db)


@router.post("/users", response_class=HTMLResponse)
@shown_errors
def create_user(
    request: Request, db: Db, caller: Annotated[Caller, require(Action.MANAGE_USERS)], form: Posted
) -> Response:
    """Add a user with a role in one team; a refused one shows its reason above the form."""
    values = {"username": form.get("username"), "team": form.get("team"), "role": form.get("role")}
    try:
        accounts.create_user(
            db,
            form.get("username"),
            form.raw("password"),
            team=form.get("team") or "default",
            role=_role(form),
            by=audit_caller(caller),
            temporary=form.has("temporary"),
        )
    except TreadleError as exc:
        return _users_page(request, db, error=str(exc), values=values)
    return see_other("/users?done=created")


@router.post("/users/{username}/role", response_class=HTMLResponse)
@shown_errors
def set_role(
    request: Request,
    db: Db,
    caller: Annotated[Caller, require(Action.MANAGE_USERS)],
    username: str,
    form: Posted,
) -> Response:
    """Give a user a role in a team, or take it away (`none`). Their sessions end."""
    team = form.get("team")
    role = None if form.get("role") == "none" else _role(form)
    try:
        accounts.set_role(db, username, team=team, role=role, by=audit_caller(caller))
    except TreadleError as exc:
        return _users_page(request, db, error=f"{username}: {exc}")
    return see_other(f"/users?done=role#user-{username}")


def _set_active(request: Request, db: Database, caller: Caller, username: str, *, active: bool) -> Response:
    if not active and username == caller.principal.username:
        return _users_page(request, db, error="you cannot disable your own account")
    try:
        accounts.set_active(db, username, active=active, by=audit_caller(caller))
    except TreadleError as exc:
        return _users_page(request, db, error=f"{username}: {exc}")
    return see_other(f"/users?done={'enabled' if active else 'disabled'}#user-{username}")


@router.post("/users/{username}/disable", response_class=HTMLResponse)
@shown_errors
def disable_user(
    request: Request,
    db: Db,
    caller: Annotated[Caller, require(Action.MANAGE_USERS)],
    username: str,
    form: Posted,
) -> Response:
    """Disable a user: their sessions and tokens stop working at once."""
    return _set_active(request, db, caller, username, active=False)


@router.post("/users/{username}/enable", response_class=HTMLResponse)
@shown_errors
def enable_user(
    request: Request,
    db: Db,
    caller: Annotated[Caller, require(Action.MANAGE_USERS)],
    username: str,
    form: Posted,
) -> Response:
    """Enable a disabled user again."""
    return _set_active(request, db, caller, username, active=True)


def _tokens_page(
    request: Request,
    db: Database,
    caller: Caller,
    *,
    status: int = 200,
    **context: Any,  # Any: template values (the new secret, an error, the form's values)
) -> Response:
    p = caller.principal
    everyone = is_allowed(p, Action.MANAGE_USERS)
    mine = next((u for u in accounts.list_users(db) if u.username == p.username), None)
    return page(
        request,
        "tokens.html",
        status=status,
        title="API tokens",
        tokens=accounts.list_tokens(db, username=None if everyone else p.username),
        everyone=everyone,
        memberships=mine.memberships if mine is not None else {},
        teams=_teams(db),
        roles=ROLE_CHOICES,
        now=accounts.current_time(db),
        done=DONE.get(request.query_params.get("done", ""), ""),
        **{"secret": None, "created": None, "error": "", "values": {}, **context},
    )


@router.get("/tokens", response_class=HTMLResponse)
@shown_errors
def tokens(request: Request, db: Db, caller: Annotated[Caller, require(Action.OWN_ACCOUNT)]) -> Response:
    """The caller's API tokens (an admin of every team sees everyone's), never their secrets."""
    return _tokens_page(request, db, caller)


@router.post("/tokens", response_class=HTMLResponse)
@shown_errors
def create_token(
    request: Request, db: Db, caller: Annotated[Caller, require(Action.OWN_ACCOUNT)], form: Posted
) -> Response:
    """Make an API token for the caller, scoped to a team and a role they hold there; its secret
    is on the page this answers with, and nowhere else ever again."""
    p = caller.principal
    if p.token_id is not None:
        raise PermissionDenied("an API token cannot create tokens; sign in with a password")
    values = {k: form.get(k) for k in ("name", "team", "role", "expires_in_days")}
    try:
        days_text = form.get("expires_in_days")
        try:
            days = int(days_text) if days_text else None
        except ValueError:
            raise InvalidRequest(f"expires in days: not a whole number: {days_text!r}") from None
        if days is not None and not 1 <= days <= MAX_TOKEN_DAYS:
            raise InvalidRequest(f"expires in days: between 1 and {MAX_TOKEN_DAYS}, or empty for never")
        secret, record = accounts.create_token(
            db,
            p.username,
            name=form.get("name"),
            team=form.get("team"),
            role=_role(form),
            expires_in=timedelta(days=days) if days else None,
            by=audit_caller(caller),
        )
    except TreadleError as exc:
        return _tokens_page(request, db, caller, error=str(exc), values=values)
    return _tokens_page(request, db, caller, status=201, secret=secret, created=record)


@router.post("/tokens/{token_id}/revoke", response_class=HTMLResponse)
@shown_errors
def revoke_token(
    request: Request,
    db: Db,
    caller: Annotated[Caller, require(Action.OWN_ACCOUNT)],
    token_id: int,
    form: Posted,
) -> Response:
    """Revoke one of the caller's tokens (an admin of every team may revoke any)."""
    p = caller.principal
    found = accounts.get_token(db, token_id)
    if found is None or (found.user_id != p.user_id and not is_allowed(p, Action.MANAGE_USERS)):
        raise AccountNotFound(f"no token {token_id} of yours")
    accounts.revoke_token(db, token_id, by=audit_caller(caller))
    return see_other("/tokens?done=revoked")


def _pools_page(
    request: Request,
    db: Database,
    *,
    status: int = 200,
    error: str = "",
    values: dict[str, str] | None = None,
) -> Response:
    return page(
        request,
        "pools.html",
        title="Pools",
        pools=pools.list_pools(db),
        error=error,
        values=values or {},
        max_slots=pools.MAX_POOL_SLOTS,
        done=DONE.get(request.query_params.get("done", ""), ""),
    )


@router.get("/pools", response_class=HTMLResponse)
@shown_errors
def pool_list(
    request: Request, db: Db, _caller: Annotated[Caller, require(Action.READ_OPERATIONS)]
) -> Response:
    """Every pool: slots used of its size, what runs and waits in it; operators resize them."""
    return _pools_page(request, db)


@router.post("/pools", response_class=HTMLResponse)
@shown_errors
def save_pool(
    request: Request, db: Db, caller: Annotated[Caller, require(Action.WRITE_POOLS)], form: Posted
) -> Response:
    """Create a pool or change its size (and description)."""
    name, slots_text = form.get("name"), form.get("slots")
    values = {"name": name, "slots": slots_text, "description": form.get("description")}
    try:
        try:
            slots = int(slots_text)
        except ValueError:
            raise InvalidRequest(f"slots: not a whole number: {slots_text!r}") from None
        known = {p.name: p for p in pools.list_pools(db)}
        description = form.get("description") if form.has("description") else None
        if description is None and name in known:
            description = known[name].description
        pools.set_pool(db, name, slots=slots, description=description, actor=caller.principal.actor)
    except TreadleError as exc:
        return _pools_page(request, db, error=f"pool {name!r}: {exc}", values=values)
    return see_other(f"/pools?done=pool#pool-{name}")
