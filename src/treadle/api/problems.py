"""Errors as RFC 9457 problem+json: one table maps treadle's errors to HTTP statuses."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from treadle.errors import (
    AccountConflict,
    AccountNotFound,
    AttemptLogMissing,
    BackfillConflict,
    ClearConflict,
    ConfigError,
    DagInactive,
    DagNotFound,
    DatabaseUnavailable,
    IdempotencyKeyInProgress,
    IdempotencyKeyReused,
    InvalidRequest,
    NotAuthenticated,
    Overloaded,
    ParamsInvalid,
    PasswordChangeRequired,
    PermissionDenied,
    RunNotFound,
    SchemaOutOfDate,
    TaskInstanceNotFound,
    TooManyAttempts,
    TreadleError,
)

log = logging.getLogger("treadle.api")
MEDIA_TYPE = "application/problem+json"

#: treadle error class -> (HTTP status, title). The nearest class in an error's MRO wins.
STATUS: dict[type[TreadleError], tuple[int, str]] = {
    NotAuthenticated: (401, "Not authenticated"),
    PermissionDenied: (403, "Forbidden"),
    PasswordChangeRequired: (403, "Password change required"),
    TooManyAttempts: (429, "Too many attempts"),
    Overloaded: (429, "Overloaded"),
    AccountNotFound: (404, "Not found"),
    DagNotFound: (404, "DAG not found"),
    RunNotFound: (404, "Run not found"),
    TaskInstanceNotFound: (404, "Task instance not found"),
    AttemptLogMissing: (404, "Log not found"),
    AccountConflict: (409, "Conflict"),
    ClearConflict: (409, "Conflict"),
    BackfillConflict: (409, "Conflict"),
    DagInactive: (409, "DAG inactive"),
    ParamsInvalid: (422, "Invalid params"),
    IdempotencyKeyReused: (422, "Idempotency-Key reused"),
    IdempotencyKeyInProgress: (409, "Idempotency-Key in use"),
    InvalidRequest: (400, "Invalid request"),
    ConfigError: (400, "Invalid request"),
    DatabaseUnavailable: (503, "Database unavailable"),
    SchemaOutOfDate: (503, "Database schema out of date"),
}


def problem(status: int, title: str, detail: str, **extra: Any) -> JSONResponse:
    """A problem+json response."""
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail, **extra}
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body, status_code=status, media_type=MEDIA_TYPE, headers=headers)


def for_error(exc: TreadleError) -> JSONResponse:
    """The response for a treadle error (500 for a class without a mapping)."""
    status, title = next((STATUS[c] for c in type(exc).__mro__ if c in STATUS), (500, "Internal error"))
    extra: dict[str, Any] = {}
    if isinstance(exc, ParamsInvalid):
        extra["errors"] = [
            {"field": f"conf{v.path[1:] if v.path.startswith('$') else v.path}", "message": v.message}
            for v in exc.violations
        ]
    if isinstance(exc, Overloaded):
        extra["limit"] = {
            "setting": exc.setting,
            "value": exc.limit,
            "scope": exc.scope,
            "name": exc.name,
            "queued": exc.queued,
            "adding": exc.adding,
        }
    if isinstance(exc, PasswordChangeRequired):
        extra["password_change"] = "/api/v1/auth/password"
    response = problem(status, title, str(exc) if status != 500 else "internal error", **extra)
    if isinstance(exc, TooManyAttempts | Overloaded | IdempotencyKeyInProgress):
        response.headers["Retry-After"] = str(exc.retry_after_s)
    return response


def _field(loc: tuple[Any, ...] | list[Any]) -> str:
    return ".".join(str(p) for p in loc)


def install(app: FastAPI) -> None:
    """Register the handlers that turn every error into problem+json."""

    @app.exception_handler(TreadleError)
    async def treadle_error(_request: Request, exc: TreadleError) -> JSONResponse:
        return for_error(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"field": _field(e["loc"]), "message": e["msg"]} for e in exc.errors()]
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        return problem(422, "Invalid request", detail, errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return problem(exc.status_code, str(exc.detail), str(exc.detail))

    @app.exception_handler(Exception)
    async def crash(request: Request, exc: Exception) -> JSONResponse:
        log.error(
            "unhandled error in the API",
            exc_info=exc,
            extra={"event": "api.error", "path": request.url.path},
        )
        return problem(500, "Internal error", "internal error")


#: The JSON Schema of every error body (RFC 9457 plus treadle's extension members).
PROBLEM_SCHEMA: dict[str, Any] = {
    "title": "Problem",
    "type": "object",
    "required": ["type", "title", "status", "detail"],
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "errors": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["field", "message"],
                "properties": {"field": {"type": "string"}, "message": {"type": "string"}},
            },
        },
        "limit": {"type": "object"},
        "password_change": {"type": "string"},
    },
}


def document(app: FastAPI) -> None:
    """Describe the error bodies as they are: problem+json (FastAPI documents its own 422 shape).

    Every operation's 422 and its `default` response point at the Problem schema, so a client
    (or schemathesis) can check any error answer against the document.
    """
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = build()
        components = doc.setdefault("components", {}).setdefault("schemas", {})
        components["Problem"] = PROBLEM_SCHEMA
        for path in doc.get("paths", {}).values():
            for operation in path.values():
                responses = operation.setdefault("responses", {})
                error = {"content": {MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}}}
                responses["default"] = {"description": "An error (RFC 9457 problem+json)", **error}
                if "422" in responses:
                    responses["422"] = {"description": "Invalid request: every field at fault", **error}
        for unused in ("HTTPValidationError", "ValidationError"):
            components.pop(unused, None)
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
