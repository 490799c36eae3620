"""GET /metrics: the Prometheus exposition of the API process (and, in standalone, of its
scheduler and worker). Needs a viewer's credentials unless TREADLE_API_METRICS_PUBLIC is set."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from treadle.api.deps import require
from treadle.api.guard import Caller
from treadle.domain.access import Action
from treadle.observability.metrics import CONTENT_TYPE, Metrics

PATH = "/metrics"


async def _exposition(request: Request) -> Response:
    metrics: Metrics = request.app.state.metrics
    # The database gauges are read here: off the event loop.
    body = await run_in_threadpool(metrics.exposition)
    return Response(body, media_type=CONTENT_TYPE)


def guarded_router() -> APIRouter:
    """/metrics for callers with the READ_METRICS permission (a bearer token, for Prometheus)."""
    router = APIRouter()

    @router.get(PATH, include_in_schema=False)
    async def metrics(request: Request, _caller: Annotated[Caller, require(Action.READ_METRICS)]) -> Response:
        """Prometheus text exposition."""
        return await _exposition(request)

    return router


def public_router() -> APIRouter:
    """/metrics for anyone who can reach the port (the guard exempts the exact path)."""
    router = APIRouter()

    @router.get(PATH, include_in_schema=False)
    async def metrics(request: Request) -> Response:
        """Prometheus text exposition."""
        return await _exposition(request)

    return router
