"""The optional parts of treadle and the extra that installs each.

`pip install treadle` is the core: DAGs, the scheduler, the worker and the CLI, on SQLite. The
REST API and web UI come with `treadle[web]`: a worker or scheduler host serves no HTTP and
needs none of FastAPI, pydantic, uvicorn, Jinja2, itsdangerous or argon2. Database drivers
have their own extras (`postgres`, `mysql`; store/database.py names them).
"""

from __future__ import annotations

import importlib.util

from treadle.errors import ConfigError

#: The modules of the `web` extra, each with the distribution that installs it.
WEB_MODULES: dict[str, str] = {
    "fastapi": "fastapi",
    "pydantic": "pydantic",
    "uvicorn": "uvicorn",
    "jinja2": "jinja2",
    "itsdangerous": "itsdangerous",
    "argon2": "argon2-cffi",
}


def missing_web_modules() -> list[str]:
    """The distributions of the `web` extra that are not installed (nothing is imported)."""
    return [dist for module, dist in WEB_MODULES.items() if importlib.util.find_spec(module) is None]


def require_web(what: str) -> None:
    """ConfigError naming the extra if `what` (the REST API, passwords) cannot run here."""
    missing = missing_web_modules()
    if missing:
        raise ConfigError(
            f"{what} needs the web extra, which is not installed (missing: {', '.join(missing)}): "
            "pip install 'treadle[web]'"
        )
