"""The web UI's fixed paths: what the guard serves without a session (exact paths only) and what
an account that must change its password may still open. Imports nothing of the API."""

from __future__ import annotations

from pathlib import Path

LOGIN = "/login"
PASSWORD = "/password"
LOGOUT = "/logout"
STATIC = "/static"
STATIC_DIR = Path(__file__).parent / "static"
#: Static file types served, by suffix.
MEDIA_TYPES = {".css": "text/css", ".js": "text/javascript", ".svg": "image/svg+xml", ".txt": "text/plain"}


def static_files() -> dict[str, Path]:
    """URL path -> file of every static file."""
    return {f"{STATIC}/{p.name}": p for p in sorted(STATIC_DIR.iterdir()) if p.suffix in MEDIA_TYPES}


#: Served without credentials: the sign-in page and each static file, by exact path.
PUBLIC = frozenset({LOGIN, *static_files()})
#: What an account with a temporary password may still use besides the API's own list.
PASSWORD_PAGES = frozenset({PASSWORD, LOGOUT})
