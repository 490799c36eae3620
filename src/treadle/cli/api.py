"""`treadle api`: serve the REST API with uvicorn, after the secure start-up checks."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import click

from treadle.cli.main import Context, cli, pass_context, require_schema
from treadle.engine import accounts
from treadle.errors import ConfigError
from treadle.extras import require_web
from treadle.observability.logging import configure_logging
from treadle.store.database import Database

if TYPE_CHECKING:
    from fastapi import FastAPI

    from treadle.api.settings import ApiSettings
    from treadle.observability.metrics import Metrics


@cli.command("api")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535))
@click.option("--log-level", default="INFO", show_default=True)
@pass_context
def api_cmd(ctx: Context, host: str, port: int, log_level: str) -> None:
    """Serve the REST API (under /api/v1; /healthz and /readyz for probes).

    The first start creates the user `admin` with a one-time password (printed here, or
    TREADLE_ADMIN_PASSWORD) that must be changed before anything else. Bound to a
    non-loopback address, or on a database other machines share, it refuses to start without
    a strong TREADLE_SECRET_KEY or while that password is unchanged.
    """
    configure_logging(log_level, log_format=ctx.settings.log_format)
    app = build_app(ctx, host=host)
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False, server_header=False)
    click.echo(f"treadle api: serving http://{host}:{port}/ (API at /api/v1, docs at /api/v1/docs)", err=True)
    uvicorn.Server(config).run()


def build_app(ctx: Context, *, host: str, metrics: Metrics | None = None) -> FastAPI:
    """Open the database, bootstrap the admin, refuse an unsafe start; the app to serve."""
    require_web("serving the REST API and web UI")
    # Imported here, so the other commands do not pay for FastAPI at every start.
    from treadle.api.app import create_app
    from treadle.api.settings import (
        ApiSettings,
        is_local_sqlite,
        is_loopback,
        local_secret_key,
        start_problems,
    )

    settings = ctx.settings
    api_settings = ApiSettings.from_env(ctx.layered.env)
    local = is_local_sqlite(settings.database_url)
    db = ctx.db_upgraded("treadle-api") if local else _api_db(ctx)
    announce_bootstrap(db, api_settings)
    problems = start_problems(
        host=host,
        database_url=settings.database_url,
        secret_key=api_settings.secret_key,
        bootstrap_unchanged=accounts.has_unchanged_bootstrap_password(db),
    )
    if problems:
        raise ConfigError("the API refuses to start: " + "; ".join(problems))
    key = api_settings.secret_key
    if key is None:
        # Only reachable on loopback with a local SQLite file (else start_problems refused).
        assert is_loopback(host) and local
        key = local_secret_key(settings.home)
    return create_app(
        db,
        api_settings,
        secret_key=key,
        worker_stale_s=settings.lease_s,
        queue_timeout_s=settings.queue_timeout_s,
        admission=settings.admission_limits,
        logs_dir=settings.logs_dir,
        backfill_max_span_days=settings.backfill_max_span_days,
        process_metrics=metrics,
    )


#: Connections the API keeps open: each request holds one at a time, and uvicorn's thread pool
#: runs up to 40 requests at once. Beyond it up to 10 more are opened, and closed once returned:
#: a pool smaller than the requests in flight opens and closes a connection for many of them.
API_POOL_SIZE = 20


def _api_db(ctx: Context) -> Database:
    """The API's database (a larger pool than the CLI's), checked to be at the code's revision."""
    db = ctx.open_db("treadle-api", pool_size=API_POOL_SIZE)
    require_schema(db)
    return db


def announce_bootstrap(db: Database, api_settings: ApiSettings) -> None:
    """Create the bootstrap admin on a database without users, and say so once."""
    password = accounts.bootstrap_admin(db, password=api_settings.admin_password)
    if password is None:
        return
    if api_settings.admin_password is not None:
        click.echo("created user admin with the password in TREADLE_ADMIN_PASSWORD", err=True)
    else:
        click.echo(f"created user admin with the one-time password: {password}", err=True)
    click.echo(
        "change it before anything else: sign in to the web UI (it asks for a new one), "
        "POST /api/v1/auth/password or `treadle users set-password admin`",
        err=True,
    )


class ApiInThread:
    """The API served by uvicorn on a thread of another process (`treadle standalone`)."""

    def __init__(self, app: FastAPI, *, host: str, port: int) -> None:
        import socket

        import uvicorn

        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            # Bound here, on the calling thread, so a busy port stops the start with a clear error.
            self._socket.bind((host, port))
        except OSError as exc:
            self._socket.close()
            raise ConfigError(
                f"cannot serve the API on {host}:{port}: {exc.strerror}; use --api-port or --no-api"
            ) from None
        config = uvicorn.Config(app, log_config=None, access_log=False, server_header=False)
        # Off the main thread uvicorn installs no signal handlers: the process's own handle them.
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, name="treadle-api", daemon=True
        )

    def start(self) -> None:
        """Serve in the background."""
        self._thread.start()

    def stop(self) -> None:
        """Finish the requests in flight and stop serving."""
        self._server.should_exit = True
        self._thread.join(timeout=15)
        self._socket.close()
