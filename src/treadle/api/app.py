"""The app factory: routers under /api/v1, the guard in front, problem+json for every error."""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse

from treadle.api import problems
from treadle.api.guard import API, EXEMPT, Guard
from treadle.api.routes import (
    accounts,
    backfills,
    dags,
    dataset_access,
    health,
    logs,
    metrics,
    operations,
    runs,
)
from treadle.api.sessions import SessionCodec
from treadle.api.settings import ApiSettings
from treadle.domain.admission import NO_LIMITS, AdmissionLimits
from treadle.engine.idempotency import ExpiredKeys
from treadle.observability.metrics import DatabaseGauges, Metrics
from treadle.store.database import Database
from treadle.web.app import mount


def create_app(
    db: Database,
    settings: ApiSettings,
    *,
    secret_key: str,
    worker_stale_s: float = 30.0,
    queue_timeout_s: float = 600.0,
    admission: AdmissionLimits = NO_LIMITS,
    logs_dir: Path | None = None,
    backfill_max_span_days: float = 366.0,
    process_metrics: Metrics | None = None,
) -> FastAPI:
    """A FastAPI app serving treadle's REST API on `db`.

    `secret_key` signs session cookies; `worker_stale_s` (the lease) is how long a silent worker
    counts as live; `queue_timeout_s` is the deployment's default for triggered runs;
    `admission` limits the queued task instances a trigger or a backfill may add to;
    `logs_dir` is where attempt logs of this host are (None: no logs served, and the web UI shows none).
    `process_metrics`: the metrics /metrics serves (standalone shares its scheduler's and worker's);
    None: the API's own. Either way the database gauges are added.
    """
    app = FastAPI(
        title="treadle",
        version="1",
        openapi_url=f"{API}/openapi.json",
        docs_url=None,
        redoc_url=None,
    )
    app.state.db = db
    app.state.api_settings = settings
    app.state.codec = SessionCodec(secret_key, max_age_s=settings.session_hours * 3600)
    app.state.worker_stale_s = worker_stale_s
    app.state.queue_timeout_s = queue_timeout_s
    app.state.admission = admission
    app.state.logs_dir = logs_dir
    app.state.backfill_max_span_days = backfill_max_span_days
    app.state.expired_keys = ExpiredKeys()
    app.state.metrics = _metrics(db, process_metrics, worker_stale_s=worker_stale_s)
    problems.install(app)
    problems.document(app)
    # The routes go straight into the app's table (not include_router, which newer FastAPI
    # resolves lazily): the route inventory test and the guard see one flat list.
    for module in (health, accounts, dags, runs, operations, dataset_access, logs, backfills):
        app.router.routes.extend(module.router.routes)
    metrics_routes = metrics.public_router() if settings.metrics_public else metrics.guarded_router()
    app.router.routes.extend(metrics_routes.routes)
    app.add_api_route(f"{API}/docs", _docs, include_in_schema=False, methods=["GET"])
    mount(app, logs_dir=logs_dir)
    exempt = EXEMPT | {metrics.PATH} if settings.metrics_public else EXEMPT
    app.add_middleware(
        Guard, db=db, codec=app.state.codec, max_body_bytes=settings.max_body_bytes, exempt=exempt
    )
    return app


def _metrics(db: Database, given: Metrics | None, *, worker_stale_s: float) -> Metrics:
    """The metrics /metrics serves, with the database gauges and the API's database calls timed."""
    result = given if given is not None else Metrics()
    if db.on_call is None:
        result.time_database(db)
    result.watch(DatabaseGauges(db, worker_stale_s=worker_stale_s))
    return result


def _docs() -> HTMLResponse:
    """Swagger UI, with a CSP that allows its CDN and exactly its one inline script (by hash)."""
    page = get_swagger_ui_html(openapi_url=f"{API}/openapi.json", title="treadle API")
    html = bytes(page.body).decode()
    hashes = " ".join(
        f"'sha256-{base64.b64encode(hashlib.sha256(s.encode()).digest()).decode()}'"
        for s in re.findall(r"<script>(.*?)</script>", html, flags=re.S)
    )
    cdn = "https://cdn.jsdelivr.net"
    csp = (
        f"default-src 'none'; script-src {cdn} {hashes}; style-src {cdn}; img-src {cdn} "
        "https://fastapi.tiangolo.com data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'"
    )
    return HTMLResponse(html, headers={"Content-Security-Policy": csp})
