"""Mounting the web UI on the API's app: its pages and its static files (the guard already knows
their public paths: treadle.web.public)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import Response

from treadle.api import problems
from treadle.api.guard import API
from treadle.errors import PermissionDenied
from treadle.web import routes_admin, routes_auth, routes_dags, routes_ops, routes_runs
from treadle.web.public import MEDIA_TYPES, static_files
from treadle.web.render import page


def mount(app: FastAPI, *, logs_dir: Path | None) -> None:
    """Add the pages and static files to `app` (`logs_dir`: where attempt logs are read)."""
    app.state.logs_dir = logs_dir
    for module in (routes_auth, routes_dags, routes_runs, routes_ops, routes_admin):
        app.router.routes.extend(module.router.routes)
    for url, path in static_files().items():
        app.add_api_route(url, _serve(path), include_in_schema=False, methods=["GET"])
    app.add_exception_handler(PermissionDenied, _denied)  # type: ignore[arg-type]


async def _denied(request: Request, exc: PermissionDenied) -> Response:
    """A page's permission refused before its handler ran: an HTML page for a browser, the
    API's problem+json for everyone else (and for every API path)."""
    wants_html = "text/html" in request.headers.get("accept", "")
    if request.url.path.startswith(f"{API}/") or not wants_html:
        return problems.for_error(exc)
    return page(request, "error.html", status=403, title="Forbidden", heading="Forbidden", message=str(exc))


def _serve(path: Path) -> Callable[[], Response]:
    """A handler answering with the file's bytes (read once: the static files are small)."""
    media, body = MEDIA_TYPES[path.suffix], path.read_bytes()

    def serve() -> Response:
        return Response(body, media_type=media, headers={"cache-control": "public, max-age=300"})

    return serve
