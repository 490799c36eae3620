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
from treadle.api.guard import API, Guard
from treadle.api.routes import accounts, dags, health, operations, runs
from treadle.api.sessions import SessionCodec
from treadle.api.settings import ApiSettings
from treadle.store.database import Database
from treadle.web.app import mount


def create_app(
    db: Database,
    settings: ApiSettings,
    *,
    secret_key: str,
    worker_stale_s: float = 30.0,
    queue_timeout_s: float = 600.0,
    logs_dir: Path | None = None,
) -> FastAPI:
    """A FastAPI app serving treadle's REST API on `db`.

    `secret_key` signs session cookies; `worker_stale_s` (the lease) is how long a silent worker
    counts as live; `queue_timeout_s` is the deployment's default for triggered runs;
    `logs_dir` is where the web UI reads attempt logs (None: it shows none).
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
    problems.install(app)
    # The routes go straight into the app's table (not include_router, which newer FastAPI
    # resolves lazily): the route inventory test and the guard see one flat list.
    for module in (health, accounts, dags, runs, operations):
        app.router.routes.extend(module.router.routes)
    app.add_api_route(f"{API}/docs", _docs, include_in_schema=False, methods=["GET"])
    mount(app, logs_dir=logs_dir)
    app.add_middleware(Guard, db=db, codec=app.state.codec, max_body_bytes=settings.max_body_bytes)
    return app


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
