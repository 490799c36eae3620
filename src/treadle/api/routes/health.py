"""Liveness and readiness probes (served without credentials, at exact paths only)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from treadle.api.schemas import Check, Health
from treadle.engine.health import readiness

router = APIRouter()


@router.get("/healthz", response_model=Health)
def healthz() -> Health:
    """The process is alive and serving (no database call)."""
    return Health(status="ok", checks=[Check(name="process", ok=True, detail="serving")])


@router.get("/readyz", response_model=Health, responses={503: {"model": Health}})
def readyz(request: Request) -> JSONResponse:
    """Ready when the database answers, its schema is the code's and a scheduler leads recently."""
    checks = readiness(
        request.app.state.db, scheduler_window_s=request.app.state.api_settings.ready_scheduler_window_s
    )
    ok = all(c.ok for c in checks)
    body = Health(
        status="ok" if ok else "unavailable",
        checks=[Check(name=c.name, ok=c.ok, detail=c.detail) for c in checks],
    )
    return JSONResponse(body.model_dump(), status_code=200 if ok else 503)
