"""Sign-in, the forced password change and sign-out."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, Response

from treadle.api.deps import audit_caller, get_db, require
from treadle.api.guard import Caller
from treadle.api.routes.accounts import _set_session
from treadle.api.sessions import CSRF_COOKIE, SESSION_COOKIE
from treadle.api.settings import ApiSettings
from treadle.domain.access import Action
from treadle.engine import accounts
from treadle.errors import InvalidRequest, NotAuthenticated, PermissionDenied, TooManyAttempts
from treadle.store.database import Database
from treadle.web.forms import Posted
from treadle.web.public import LOGIN, LOGOUT, PASSWORD
from treadle.web.render import page, see_other, viewer

router = APIRouter(include_in_schema=False)
Db = Annotated[Database, Depends(get_db)]
Self = Annotated[Caller, require(Action.OWN_ACCOUNT)]


def safe_next(target: str | None) -> str:
    """Where to go after signing in: a path on this site only (never another origin)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


@router.get(LOGIN, response_class=HTMLResponse)
def login_form(request: Request, next: Annotated[str | None, Query(max_length=500)] = None) -> Response:
    """The sign-in page."""
    return page(request, "login.html", title="Sign in", next=safe_next(next), error="", username="")


@router.post(LOGIN, response_class=HTMLResponse)
def login(request: Request, db: Db, form: Posted) -> Response:
    """Check the password; a fresh session cookie, then the page asked for (or the password change)."""
    settings: ApiSettings = request.app.state.api_settings
    username, target = form.get("username"), safe_next(form.get("next"))
    address = request.client.host if request.client else None
    try:
        if not username or not form.raw("password"):
            raise InvalidRequest("enter your user name and password")
        user = accounts.log_in(
            db, username, form.raw("password"), address=address, limits=settings.login_limits
        )
    except (NotAuthenticated, InvalidRequest, TooManyAttempts) as exc:
        message = "wrong user name or password" if isinstance(exc, NotAuthenticated) else str(exc)
        # The form again with the error (200: a browser logs an error status as a console error).
        return page(request, "login.html", title="Sign in", next=target, error=message, username=username)
    response = see_other(PASSWORD if user.must_change_password else target)
    _set_session(request, response, user_id=user.id, version=user.session_version)
    return response


@router.get(PASSWORD, response_class=HTMLResponse)
def password_form(request: Request, _caller: Self) -> Response:
    """The password change page (the only page an account with a temporary password may see)."""
    return page(request, "password.html", title="Change password", errors={})


@router.post(PASSWORD, response_class=HTMLResponse)
def change_password(request: Request, db: Db, _caller: Self, form: Posted) -> Response:
    """Change the caller's own password; this browser gets a new session, every other one ends."""
    who = viewer(request).caller
    current, new, again = form.raw("current_password"), form.raw("new_password"), form.raw("confirm_password")
    errors: dict[str, str] = {}
    if not current:
        errors["current_password"] = "enter your current password"
    if not new:
        errors["new_password"] = "enter a new password"
    elif new != again:
        errors["confirm_password"] = "the two new passwords differ"
    if not errors:
        try:
            version = accounts.set_password(
                db, who.principal.username, new, by=audit_caller(who), current_password=current
            )
        except PermissionDenied as exc:
            errors["current_password"] = str(exc)
        except InvalidRequest as exc:
            errors["new_password"] = str(exc)
        else:
            response = see_other("/")
            _set_session(request, response, user_id=who.principal.user_id, version=version)
            return response
    return page(request, "password.html", title="Change password", errors=errors)


@router.post(LOGOUT)
def logout(request: Request, db: Db, _caller: Self) -> Response:
    """End every session of the caller and clear the cookies."""
    who = viewer(request).caller
    if who.via_cookie:
        accounts.end_sessions(db, who.principal.username, by=audit_caller(who))
    response = see_other(LOGIN)
    response.delete_cookie(SESSION_COOKIE, path="/")
    response.delete_cookie(CSRF_COOKIE, path="/")
    return response
