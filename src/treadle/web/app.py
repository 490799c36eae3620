"""Mounting the web UI on the API's app: its pages and its static files (the guard already knows
their public paths: treadle.web.public)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import Response

from treadle.web import routes_auth, routes_dags, routes_ops, routes_runs
from treadle.web.public import MEDIA_TYPES, static_files


def mount(app: FastAPI, *, logs_dir: Path | None) -> None:
    """Add the pages and static files to `app` (`logs_dir`: where attempt logs are read)."""
    app.state.logs_dir = logs_dir
    for module in (routes_auth, routes_dags, routes_runs, routes_ops):
        app.router.routes.extend(module.router.routes)
    for url, path in static_files().items():
        app.add_api_route(url, _serve(path), include_in_schema=False, methods=["GET"])


def _serve(path: Path) -> Callable[[], Response]:
    """A handler answering with the file's bytes (read once: the static files are small)."""
    media, body = MEDIA_TYPES[path.suffix], path.read_bytes()

    def serve() -> Response:
        return Response(body, media_type=media, headers={"cache-control": "public, max-age=300"})

    return serve
