"""Mounting the web UI on the API's app: its routes, its static files, and what the guard lets through."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import Response

from treadle.api.guard import PageGate
from treadle.web import routes_auth, routes_dags, routes_ops, routes_runs
from treadle.web.render import STATIC_DIR

STATIC = "/static"
_TYPES = {".css": "text/css", ".js": "text/javascript", ".svg": "image/svg+xml", ".txt": "text/plain"}


def static_files() -> dict[str, Path]:
    """URL path -> file of every static file (each is exempt from sign-in by its exact path)."""
    return {f"{STATIC}/{p.name}": p for p in sorted(STATIC_DIR.iterdir()) if p.suffix in _TYPES}


def mount(app: FastAPI, *, logs_dir: Path | None) -> PageGate:
    """Add the pages and static files to `app`; what the guard must know of them."""
    app.state.logs_dir = logs_dir
    for module in (routes_auth, routes_dags, routes_runs, routes_ops):
        app.router.routes.extend(module.router.routes)
    files = static_files()
    for url, path in files.items():
        app.add_api_route(url, _serve(path), include_in_schema=False, methods=["GET"])
    return PageGate(
        public=frozenset({routes_auth.LOGIN, *files}),
        password_allowed=frozenset({routes_auth.PASSWORD, routes_auth.LOGOUT}),
        login=routes_auth.LOGIN,
        password=routes_auth.PASSWORD,
    )


def _serve(path: Path) -> Callable[[], Response]:
    """A handler answering with the file's bytes (read once: the static files are small)."""
    media, body = _TYPES[path.suffix], path.read_bytes()

    def serve() -> Response:
        return Response(body, media_type=media, headers={"cache-control": "public, max-age=300"})

    return serve
