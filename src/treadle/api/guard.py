"""The gate in front of every route: body limit, authentication, CSRF, the password-change
gate, security headers and the audit record of every mutating call.

Deny by default (S6): only the exact paths in EXEMPT pass without credentials; anything else,
including paths that match no route, needs a valid session or token.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, quote

from sqlalchemy.engine import Connection
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from treadle.api.problems import problem
from treadle.api.sessions import CSRF_FORM_FIELD, CSRF_HEADER, SESSION_COOKIE, SessionCodec, csrf_matches
from treadle.domain.access import Principal, redact_secrets
from treadle.engine import accounts
from treadle.store import audit
from treadle.store.database import Database, Enlistment, db_now
from treadle.web import public as web_paths

log = logging.getLogger("treadle.api")

API = "/api/v1"
#: The only paths served without credentials; matched exactly (never by prefix or suffix):
#: the API's, and the web UI's sign-in page and each of its static files.
EXEMPT = frozenset(
    {"/healthz", "/readyz", f"{API}/auth/login", f"{API}/openapi.json", f"{API}/docs", *web_paths.PUBLIC}
)
#: What an account that must change its password may still call (and, in the UI, open).
PASSWORD_CHANGE_ALLOWED = frozenset(
    {f"{API}/auth/password", f"{API}/auth/me", f"{API}/auth/logout", *web_paths.PASSWORD_PAGES}
)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: Strict by default: the API serves JSON, never script. /docs gets its own policy.
CSP = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
SECURITY_HEADERS = (
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
)
#: Largest request body written (redacted) into the audit log.
AUDITED_BODY_BYTES = 8192


@dataclass(frozen=True, slots=True, kw_only=True)
class Caller:
    """The authenticated caller of one request (kept in `request.state.caller`)."""

    principal: Principal
    via_cookie: bool
    address: str | None


class RequestAudit:
    """The `api.request` entry of one mutating call, written once: by the route, in the
    transaction of its change (`audited_with_change`), or else by the guard after the response."""

    def __init__(self, request: Request, caller: Caller, body: bytes) -> None:
        self.request, self.caller, self.body = request, caller, body
        #: Set by a route that wrote the entry with its change (once that committed, it is done).
        self.enlistment: Enlistment | None = None

    @property
    def written(self) -> bool:
        """True once the entry is in the database (with the route's change)."""
        return self.enlistment is not None and self.enlistment.committed

    def record(self, conn: Connection, *, status: int) -> None:
        """Append the entry, in the caller's transaction."""
        request = self.request
        audit.record(
            conn,
            at=db_now(conn),
            actor=self.caller.principal.actor,
            action="api.request",
            target=request.url.path,
            details={
                "method": request.method,
                "status": status,
                "query": redact_secrets(dict(request.query_params)),
                "body": _redacted_body(self.body),
            },
            address=self.caller.address,
        )


class Guard:
    """Pure ASGI middleware (so it sees every request, whatever route or lack of one)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        db: Database,
        codec: SessionCodec,
        max_body_bytes: int,
        exempt: frozenset[str] = EXEMPT,
    ) -> None:
        self.app, self.db, self.codec, self.max_body_bytes = app, db, codec, max_body_bytes
        #: EXEMPT, plus /metrics when the deployment makes it public (TREADLE_API_METRICS_PUBLIC).
        self.exempt = exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        send = _with_headers(send, docs=scope["path"] == f"{API}/docs")
        request = Request(scope)
        body = await _read_body(receive, self.max_body_bytes)
        if body is None:
            detail = f"the request body is larger than {self.max_body_bytes} bytes"
            await problem(413, "Request body too large", detail)(scope, receive, send)
            return
        replay = _replay(body)
        if scope["path"] in self.exempt:
            await self.app(scope, replay, send)
            return
        # A token whose principal is cached needs no database call: no thread hop for it.
        known = self._authenticate_cached(request)
        if known is not None:
            caller, refusal = known
        else:
            caller, refusal = await run_in_threadpool(self._authenticate, request, body)
        if refusal is not None:
            status, title, detail = refusal
            redirect = self._page_redirect(request, status, title)
            if redirect is not None:
                await _see_other(redirect)(scope, replay, send)
                return
            extra = {"password_change": f"{API}/auth/password"} if title == "Password change required" else {}
            await problem(status, title, detail, **extra)(scope, replay, send)
            if status == 403 and caller is not None and request.method not in SAFE_METHODS:
                await run_in_threadpool(self._record, RequestAudit(request, caller, body), status)
            return
        assert caller is not None
        state = scope.setdefault("state", {})
        state["caller"] = caller
        pending = RequestAudit(request, caller, body) if request.method not in SAFE_METHODS else None
        state["request_audit"] = pending
        status_seen: list[int] = []
        await self.app(scope, replay, _status_recorder(send, status_seen))
        if pending is not None and not pending.written:
            await run_in_threadpool(self._record, pending, status_seen[0] if status_seen else 500)

    def _page_redirect(self, request: Request, status: int, title: str) -> str | None:
        """Where a browser opening a page goes instead of a refusal: the sign-in page, or the
        password change (None: answer the refusal, as for every API call and non-HTML client)."""
        path = request.url.path
        wants_html = "text/html" in request.headers.get("accept", "")
        if request.method != "GET" or not wants_html or path.startswith(f"{API}/"):
            return None
        if status == 401:
            return f"{web_paths.LOGIN}?next={quote(path, safe='/')}"
        if title == "Password change required":
            return web_paths.PASSWORD
        return None

    def _authenticate_cached(
        self, request: Request
    ) -> tuple[Caller | None, tuple[int, str, str] | None] | None:
        """`_authenticate`'s answer for a Bearer token whose principal is cached (no database
        call, so it runs on the event loop); None for every other request."""
        header = request.headers.get("authorization")
        if header is None:
            return None
        scheme, _, secret = header.partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            return None
        principal = accounts.cached_token_principal(self.db, secret.strip())
        if principal is None:
            return None
        address = request.client.host if request.client else None
        caller = Caller(principal=principal, via_cookie=False, address=address)
        return caller, _password_refusal(request, principal)

    def _authenticate(
        self, request: Request, body: bytes = b""
    ) -> tuple[Caller | None, tuple[int, str, str] | None]:
        address = request.client.host if request.client else None
        header = request.headers.get("authorization")
        if header is not None:
            scheme, _, secret = header.partition(" ")
            if scheme.lower() != "bearer" or not secret.strip():
                return None, (401, "Not authenticated", "the Authorization header must be `Bearer <token>`")
            principal = accounts.principal_for_token(self.db, secret.strip())
            if principal is None:
                return None, (401, "Not authenticated", "the token is unknown, revoked or expired")
            caller = Caller(principal=principal, via_cookie=False, address=address)
        else:
            cookie = request.cookies.get(SESSION_COOKIE)
            session = self.codec.read(cookie) if cookie else None
            if session is None:
                return None, (
                    401,
                    "Not authenticated",
                    "sign in (POST /api/v1/auth/login) or send a Bearer token",
                )
            principal = accounts.principal_for_session(
                self.db, session.user_id, session_version=session.session_version
            )
            if principal is None:
                return None, (401, "Not authenticated", "the session has ended; sign in again")
            caller = Caller(principal=principal, via_cookie=True, address=address)
            if request.method not in SAFE_METHODS and not csrf_matches(
                session, request.headers.get(CSRF_HEADER) or _form_csrf(request, body)
            ):
                detail = "the X-CSRF-Token header is missing or does not match the session's CSRF token"
                return caller, (403, "CSRF check failed", detail)
        return caller, _password_refusal(request, principal)

    def _record(self, pending: RequestAudit, status: int) -> None:
        """Record one mutating call: who, what, from where, with which (redacted) parameters."""
        try:
            self.db.transact(lambda conn: pending.record(conn, status=status))
        except Exception:
            # The change itself is audited by the engine in its own transaction; a lost request
            # record is logged, never turned into a failed response after the fact.
            log.exception("could not record an API call", extra={"event": "api.audit_failed"})


def _password_refusal(request: Request, principal: Principal) -> tuple[int, str, str] | None:
    """The refusal for a caller who must change their password first, except on the routes
    that lead there (None: nothing to refuse)."""
    if principal.must_change_password and request.url.path not in PASSWORD_CHANGE_ALLOWED:
        return 403, "Password change required", f"change the password first: POST {API}/auth/password"
    return None


@contextmanager
def audited_with_change(request: Request, *, status: int) -> Iterator[None]:
    """Within the block, the call's `api.request` entry (with `status`) joins the next write
    transaction (the route's change), so one transaction makes the change and records the call.

    If that transaction rolls back, or there is none (a replayed answer, a refusal), the guard
    records the call after the response, with the status it had, as for any other route.
    """
    pending: RequestAudit | None = getattr(request.state, "request_audit", None)
    if pending is None:
        yield
        return
    db: Database = request.app.state.db
    with db.enlisted(lambda conn: pending.record(conn, status=status)) as enlistment:
        pending.enlistment = enlistment
        yield


def _form_csrf(request: Request, body: bytes) -> str | None:
    """The CSRF token a posted HTML form carries in its `csrf_token` field (None if none)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded" or not body:
        return None
    values = parse_qs(body.decode("utf-8", errors="replace")).get(CSRF_FORM_FIELD)
    return values[0] if values else None


def _see_other(location: str) -> ASGIApp:
    async def respond(scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": 303, "headers": [(b"location", location.encode())]}
        )
        await send({"type": "http.response.body", "body": b""})

    return respond


def _redacted_body(body: bytes) -> Any:  # Any: the JSON body, secrets masked
    if not body:
        return None
    if len(body) > AUDITED_BODY_BYTES:
        return f"<{len(body)} bytes>"
    try:
        return redact_secrets(json.loads(body))
    except ValueError:
        pass
    try:
        form = {
            k: v[0] if len(v) == 1 else v for k, v in parse_qs(body.decode(), strict_parsing=True).items()
        }
    except (ValueError, UnicodeDecodeError):
        return f"<{len(body)} bytes, not JSON>"
    form.pop(CSRF_FORM_FIELD, None)
    return redact_secrets(form)


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole request body, or None once it passes `limit` bytes."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes) -> Receive:
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


def _with_headers(send: Send, *, docs: bool) -> Send:
    async def wrapped(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", []))
            names = {k.lower() for k, _ in headers}
            headers += [(k, v) for k, v in SECURITY_HEADERS if k not in names]
            if b"content-security-policy" not in names and not docs:
                headers.append((b"content-security-policy", CSP.encode()))
            message["headers"] = headers
        await send(message)

    return wrapped


def _status_recorder(send: Send, seen: list[int]) -> Callable[[Message], Awaitable[None]]:
    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            seen.append(int(message["status"]))
        await send(message)

    return wrapped
