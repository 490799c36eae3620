"""Sign-in, the caller's own account, users, teams and API tokens."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response, status

from treadle.api.deps import audit_caller, get_db, get_settings, require
from treadle.api.guard import API, Caller
from treadle.api.schemas import (
    CreatedToken,
    LoginRequest,
    Me,
    NewTeam,
    NewToken,
    NewUser,
    PasswordChange,
    RoleChange,
    RowId,
    SessionInfo,
    TeamOut,
    TokenOut,
    UserOut,
)
from treadle.api.sessions import COOKIE_PATH, CSRF_COOKIE, SESSION_COOKIE, SessionCodec
from treadle.api.settings import ApiSettings
from treadle.domain.access import Action, TokenRecord, UserRecord, is_allowed
from treadle.engine import accounts
from treadle.errors import AccountNotFound, PermissionDenied
from treadle.store.database import Database

router = APIRouter(prefix=API)
Db = Annotated[Database, Depends(get_db)]
Settings = Annotated[ApiSettings, Depends(get_settings)]


def _set_session(request: Request, response: Response, *, user_id: int, version: int) -> str:
    """Issue a fresh session cookie (rotated at every login and password change); its CSRF token."""
    codec: SessionCodec = request.app.state.codec
    settings: ApiSettings = request.app.state.api_settings
    value, session = codec.issue(user_id=user_id, session_version=version)
    secure = settings.behind_tls or request.url.scheme == "https"
    common = {"path": COOKIE_PATH, "secure": secure, "samesite": "lax", "max_age": int(codec.max_age_s)}
    response.set_cookie(SESSION_COOKIE, value, httponly=True, **common)  # type: ignore[arg-type]
    response.set_cookie(CSRF_COOKIE, session.csrf_token, httponly=False, **common)  # type: ignore[arg-type]
    return session.csrf_token


@router.post("/auth/login", response_model=SessionInfo)
def login(
    body: LoginRequest, request: Request, response: Response, db: Db, settings: Settings
) -> SessionInfo:
    """Sign in with a password: sets an HttpOnly session cookie and returns the CSRF token."""
    address = request.client.host if request.client else None
    user = accounts.log_in(db, body.username, body.password, address=address, limits=settings.login_limits)
    csrf = _set_session(request, response, user_id=user.id, version=user.session_version)
    return SessionInfo(
        username=user.username,
        csrf_token=csrf,
        must_change_password=user.must_change_password,
        grants=user.memberships,
    )


@router.post("/auth/logout", status_code=status.HTTP_204_NO_CONTENT)
def logout(db: Db, caller: Annotated[Caller, require(Action.OWN_ACCOUNT)]) -> Response:
    """End every session of the caller (the session version moves on) and clear the cookies."""
    by = audit_caller(caller)
    if caller.via_cookie:
        accounts.end_sessions(db, caller.principal.username, by=by)
    response = Response(status_code=status.HTTP_204_NO_CONTENT)
    response.delete_cookie(SESSION_COOKIE, path=COOKIE_PATH)
    response.delete_cookie(CSRF_COOKIE, path=COOKIE_PATH)
    return response


@router.get("/auth/me", response_model=Me)
def me(caller: Annotated[Caller, require(Action.OWN_ACCOUNT)]) -> Me:
    """Who the caller is, and the grants in force for this call."""
    p = caller.principal
    return Me(
        username=p.username,
        via="session" if caller.via_cookie else "token",
        token_id=p.token_id,
        must_change_password=p.must_change_password,
        grants=p.grants,
    )


@router.post("/auth/password", response_model=SessionInfo)
def change_password(
    body: PasswordChange,
    request: Request,
    response: Response,
    db: Db,
    caller: Annotated[Caller, require(Action.OWN_ACCOUNT)],
) -> SessionInfo:
    """Change the caller's password. Every other session ends; this one gets a new cookie."""
    p = caller.principal
    version = accounts.set_password(
        db, p.username, body.new_password, by=audit_caller(caller), current_password=body.current_password
    )
    csrf = _set_session(request, response, user_id=p.user_id, version=version) if caller.via_cookie else None
    return SessionInfo(username=p.username, csrf_token=csrf, must_change_password=False, grants=p.grants)


def _user_out(u: UserRecord) -> UserOut:
    return UserOut(
        username=u.username,
        is_active=u.is_active,
        must_change_password=u.must_change_password,
        roles=u.memberships,
        created_at=u.created_at,
    )


@router.get("/users", response_model=list[UserOut])
def list_users(db: Db, _caller: Annotated[Caller, require(Action.MANAGE_USERS)]) -> list[UserOut]:
    """Every user and their roles."""
    return [_user_out(u) for u in accounts.list_users(db)]


@router.post("/users", response_model=UserOut, status_code=status.HTTP_201_CREATED)
def create_user(body: NewUser, db: Db, caller: Annotated[Caller, require(Action.MANAGE_USERS)]) -> UserOut:
    """Add a user with a role in one team (`temporary`: the password must be changed first)."""
    created = accounts.create_user(
        db,
        body.username,
        body.password,
        team=body.team or "default",
        role=body.role,
        by=audit_caller(caller),
        temporary=body.temporary,
    )
    return _user_out(created)


@router.put("/users/{username}/roles/{team}", response_model=UserOut)
def set_role(
    username: str,
    team: str,
    body: RoleChange,
    db: Db,
    caller: Annotated[Caller, require(Action.MANAGE_USERS)],
) -> UserOut:
    """Give a user a role in a team (`*`: every team). Their sessions end."""
    return _user_out(accounts.set_role(db, username, team=team, role=body.role, by=audit_caller(caller)))


@router.delete("/users/{username}/roles/{team}", response_model=UserOut)
def remove_role(
    username: str, team: str, db: Db, caller: Annotated[Caller, require(Action.MANAGE_USERS)]
) -> UserOut:
    """Take a user's role in a team away. Their sessions end."""
    return _user_out(accounts.set_role(db, username, team=team, role=None, by=audit_caller(caller)))


@router.post("/users/{username}/disable", status_code=status.HTTP_204_NO_CONTENT)
def disable_user(username: str, db: Db, caller: Annotated[Caller, require(Action.MANAGE_USERS)]) -> Response:
    """Disable a user: their sessions and tokens stop working at once."""
    accounts.set_active(db, username, active=False, by=audit_caller(caller))
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/users/{username}/enable", status_code=status.HTTP_204_NO_CONTENT)
def enable_user(username: str, db: Db, caller: Annotated[Caller, require(Action.MANAGE_USERS)]) -> Response:
    """Enable a disabled user again."""
    accounts.set_active(db, username, active=True, by=audit_caller(caller))
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/teams", response_model=list[TeamOut])
def list_teams(db: Db, _caller: Annotated[Caller, require(Action.READ_DAGS)]) -> list[TeamOut]:
    """Every team."""
    return [TeamOut(name=n, description=d) for n, d in accounts.list_teams(db)]


@router.post("/teams", response_model=TeamOut, status_code=status.HTTP_201_CREATED)
def create_team(body: NewTeam, db: Db, caller: Annotated[Caller, require(Action.MANAGE_USERS)]) -> TeamOut:
    """Add a team."""
    accounts.create_team(db, body.name, description=body.description, by=audit_caller(caller))
    return TeamOut(name=body.name, description=body.description)


def _token_out(t: TokenRecord) -> TokenOut:
    return TokenOut(
        id=t.id,
        name=t.name,
        username=t.username,
        team=t.team,
        role=t.role,
        created_at=t.created_at,
        expires_at=t.expires_at,
        revoked_at=t.revoked_at,
    )


@router.get("/tokens", response_model=list[TokenOut])
def list_tokens(db: Db, caller: Annotated[Caller, require(Action.OWN_ACCOUNT)]) -> list[TokenOut]:
    """The caller's tokens (an admin of every team sees everyone's); never their secrets."""
    p = caller.principal
    everyone = is_allowed(p, Action.MANAGE_USERS)
    return [_token_out(t) for t in accounts.list_tokens(db, username=None if everyone else p.username)]


@router.post("/tokens", response_model=CreatedToken, status_code=status.HTTP_201_CREATED)
def create_token(
    body: NewToken, db: Db, caller: Annotated[Caller, require(Action.OWN_ACCOUNT)]
) -> CreatedToken:
    """Make an API token for the caller, scoped to a team and a role they hold there.

    The secret is in this response only. A token cannot make tokens (sign in to do that).
    """
    p = caller.principal
    if p.token_id is not None:
        raise PermissionDenied("an API token cannot create tokens; sign in with a password")
    expires = timedelta(days=body.expires_in_days) if body.expires_in_days else None
    secret, record = accounts.create_token(
        db,
        p.username,
        name=body.name,
        team=body.team,
        role=body.role,
        expires_in=expires,
        by=audit_caller(caller),
    )
    return CreatedToken(token=secret, **_token_out(record).model_dump())


@router.delete("/tokens/{token_id}", status_code=status.HTTP_204_NO_CONTENT)
def revoke_token(token_id: RowId, db: Db, caller: Annotated[Caller, require(Action.OWN_ACCOUNT)]) -> Response:
    """Revoke one of the caller's tokens (an admin of every team may revoke any)."""
    p = caller.principal
    found = accounts.get_token(db, token_id)
    if found is None or (found.user_id != p.user_id and not is_allowed(p, Action.MANAGE_USERS)):
        raise AccountNotFound(f"no token {token_id} of yours")
    accounts.revoke_token(db, token_id, by=audit_caller(caller))
    return Response(status_code=status.HTTP_204_NO_CONTENT)
