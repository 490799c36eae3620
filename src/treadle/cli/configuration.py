"""`treadle config show`: the settings in effect and where each comes from."""

from __future__ import annotations

import os
from typing import Any

import click

from treadle.cli.main import Context, cli, pass_context
from treadle.cli.render import emit_json, table
from treadle.config_file import SECRETS, VARIABLES, key_of


@cli.group("config")
def config_group() -> None:
    """Settings in effect and where each comes from (env, file, default)."""


@config_group.command("show")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def show_cmd(ctx: Context, as_json: bool) -> None:
    """Print every setting's value and source: env (TREADLE_* variable), file (the settings
    file) or default. Secrets are never printed, only whether they are set; a database URL's
    password is hidden."""
    rows = effective(ctx)
    path = ctx.layered.path
    if as_json:
        emit_json({"file": str(path) if path else None, "settings": rows})
        return
    click.echo(f"settings file: {path if path else 'none'}")
    table(
        "Settings",
        ["variable", "file key", "value", "source"],
        [(r["variable"], r["key"], r["value"], r["source"]) for r in rows],
    )


def effective(ctx: Context) -> list[dict[str, Any]]:
    """Each setting (TREADLE_HOME first) with its shown value and source."""
    from treadle.api.settings import ApiSettings
    from treadle.store.database import redact

    settings = ctx.settings
    api = ApiSettings.from_env(ctx.layered.env)
    values: dict[str, Any] = {
        "TREADLE_HOME": settings.home,
        "TREADLE_DATABASE_URL": redact(settings.database_url),
        "TREADLE_DAGS_FOLDER": settings.dags_folder,
        "TREADLE_LOGS_FOLDER": settings.logs_dir,
        "TREADLE_ARTIFACTS_URL": settings.artifacts_url,
        "TREADLE_COMMAND_ALLOWLIST": ",".join(settings.command_allowlist),
        "TREADLE_DEFAULT_TASK_TIMEOUT": settings.default_task_timeout_s,
        "TREADLE_SECRET_KEY": api.secret_key,
        "TREADLE_ADMIN_PASSWORD": api.admin_password,
        "TREADLE_API_BEHIND_TLS": api.behind_tls,
        "TREADLE_API_SESSION_HOURS": api.session_hours,
        "TREADLE_API_IDEMPOTENCY_HOURS": api.idempotency_hours,
        "TREADLE_API_READY_SCHEDULER_SECONDS": api.ready_scheduler_window_s,
        "TREADLE_API_MAX_BODY_BYTES": api.max_body_bytes,
        "TREADLE_API_LOGIN_FAILURES_PER_USER": api.login_limits.per_user,
        "TREADLE_API_LOGIN_FAILURES_PER_ADDRESS": api.login_limits.per_address,
        "TREADLE_API_LOGIN_WINDOW_SECONDS": api.login_limits.window_s,
        "TREADLE_OUTBOX_WEBHOOK_URL": settings.outbox_webhook_url,
        "TREADLE_OUTBOX_WEBHOOK_SECRET": settings.outbox_webhook_secret,
        "TREADLE_OUTBOX_NATS_URL": settings.outbox_nats_url,
        "TREADLE_OUTBOX_NATS_SUBJECT_PREFIX": settings.outbox_nats_subject_prefix,
        "TREADLE_OUTBOX_NATS_JETSTREAM": settings.outbox_nats_jetstream,
        "TREADLE_ALERT_SLACK_URL": settings.alert_slack_url,
        "TREADLE_ALERT_RULES": ", ".join(r.describe() for r in settings.alerting.rules),
        "TREADLE_UI_BASE_URL": settings.ui_base_url,
    }
    from treadle.config import NUMERIC_SETTINGS

    values.update({spec.variable: getattr(settings, spec.field) for spec in NUMERIC_SETTINGS})
    rows = []
    for variable in ("TREADLE_HOME", *VARIABLES):
        value = values[variable]
        if variable in SECRETS:
            value = "(set, not shown)" if value else "(not set)"
        rows.append(
            {
                "variable": variable,
                "key": "" if variable == "TREADLE_HOME" else key_of(variable),
                "value": "" if value is None else str(value),
                "source": ctx.layered.source(variable, os.environ),
            }
        )
    return rows
