"""`treadle users`, `tokens`, `teams` and `audit`: every change is audited as cli:<os user>."""

from __future__ import annotations

import sys
from datetime import datetime
from typing import Any

import click

from treadle.cli.main import Context, cli, identity, pass_context
from treadle.cli.render import emit_json, fmt_time, table
from treadle.domain.access import ALL_TEAMS, Role
from treadle.domain.durations import parse_duration
from treadle.engine import accounts
from treadle.engine.accounts import Caller
from treadle.errors import InvalidRequest

ROLE = click.Choice([r.value for r in Role])


def _by() -> Caller:
    return Caller(actor=identity())


def _password(from_stdin: bool) -> str:
    if from_stdin:
        line = sys.stdin.readline().rstrip("\n")
        if not line:
            raise InvalidRequest("no password on standard input")
        return line
    entered: str = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    return entered


@cli.group("users")
def users_group() -> None:
    """Users and their roles per team."""


@users_group.command("create")
@click.argument("username")
@click.option("--role", type=ROLE, default="viewer", show_default=True)
@click.option(
    "--team", default="default", show_default=True, help=f"A team, or {ALL_TEAMS!r} for every team."
)
@click.option(
    "--temporary/--permanent", default=True, show_default=True, help="Must change the password first."
)
@click.option("--password-stdin", is_flag=True, help="Read the password from standard input.")
@pass_context
def create_user_cmd(
    ctx: Context, username: str, role: str, team: str, temporary: bool, password_stdin: bool
) -> None:
    """Add a user with a role in one team."""
    accounts.create_user(
        ctx.db, username, _password(password_stdin), team=team, role=Role(role), by=_by(), temporary=temporary
    )
    click.echo(f"created user {username} ({role} in {team})")


@users_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def list_users_cmd(ctx: Context, as_json: bool) -> None:
    """List users and their roles."""
    found = accounts.list_users(ctx.db)
    rows: list[dict[str, Any]] = [
        {
            "username": u.username,
            "active": u.is_active,
            "must_change_password": u.must_change_password,
            "roles": {t: r.value for t, r in sorted(u.memberships.items())},
        }
        for u in found
    ]
    if as_json:
        emit_json(rows)
        return
    table(
        "Users",
        ["user", "active", "must change password", "roles"],
        [
            (
                r["username"],
                r["active"],
                r["must_change_password"],
                ", ".join(f"{t}:{x}" for t, x in r["roles"].items()),
            )
            for r in rows
        ],
    )


@users_group.command("set-role")
@click.argument("username")
@click.argument("team")
@click.argument("role", type=click.Choice([*(r.value for r in Role), "none"]))
@pass_context
def set_role_cmd(ctx: Context, username: str, team: str, role: str) -> None:
    """Give USERNAME ROLE in TEAM (`none` removes it); their sessions end."""
    accounts.set_role(ctx.db, username, team=team, role=None if role == "none" else Role(role), by=_by())
    click.echo(f"{username}: {role} in {team}")


@users_group.command("set-password")
@click.argument("username")
@click.option("--temporary", is_flag=True, help="The user must change it at first use.")
@click.option("--password-stdin", is_flag=True, help="Read the password from standard input.")
@pass_context
def set_password_cmd(ctx: Context, username: str, temporary: bool, password_stdin: bool) -> None:
    """Set a user's password; their sessions end."""
    accounts.set_password(ctx.db, username, _password(password_stdin), by=_by(), temporary=temporary)
    click.echo(f"password of {username} set")


@users_group.command("disable")
@click.argument("username")
@pass_context
def disable_cmd(ctx: Context, username: str) -> None:
    """Disable a user: their sessions and tokens stop working."""
    accounts.set_active(ctx.db, username, active=False, by=_by())
    click.echo(f"disabled {username}")


@users_group.command("enable")
@click.argument("username")
@pass_context
def enable_cmd(ctx: Context, username: str) -> None:
    """Enable a disabled user."""
    accounts.set_active(ctx.db, username, active=True, by=_by())
    click.echo(f"enabled {username}")


@cli.group("tokens")
def tokens_group() -> None:
    """API tokens (shown once, stored hashed)."""


@tokens_group.command("create")
@click.argument("username")
@click.option("--name", required=True, help="What the token is for.")
@click.option("--team", default="default", show_default=True)
@click.option("--role", type=ROLE, default="viewer", show_default=True)
@click.option("--expires", "expires", default=None, help="Lifetime such as 90d or 12h (default: none).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def create_token_cmd(
    ctx: Context, username: str, name: str, team: str, role: str, expires: str | None, as_json: bool
) -> None:
    """Make a token for USERNAME; the secret is printed this once."""
    lifetime = parse_duration(expires) if expires else None
    secret, record = accounts.create_token(
        ctx.db, username, name=name, team=team, role=Role(role), expires_in=lifetime, by=_by()
    )
    if as_json:
        emit_json({"id": record.id, "token": secret, "expires_at": record.expires_at})
        return
    click.echo(f"token {record.id} for {username} ({role} in {team}); it is not shown again:")
    click.echo(secret)


@tokens_group.command("list")
@click.option("--user", "username", default=None)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def list_tokens_cmd(ctx: Context, username: str | None, as_json: bool) -> None:
    """List tokens (never their secrets)."""
    found = accounts.list_tokens(ctx.db, username=username)
    if as_json:
        emit_json(found)
        return
    table(
        "API tokens",
        ["id", "user", "name", "team", "role", "created", "expires", "revoked"],
        [
            (
                t.id,
                t.username,
                t.name,
                t.team,
                t.role.value,
                fmt_time(t.created_at),
                fmt_time(t.expires_at),
                fmt_time(t.revoked_at),
            )
            for t in found
        ],
    )


@tokens_group.command("revoke")
@click.argument("token_id", type=int)
@pass_context
def revoke_token_cmd(ctx: Context, token_id: int) -> None:
    """Revoke a token."""
    accounts.revoke_token(ctx.db, token_id, by=_by())
    click.echo(f"revoked token {token_id}")


@cli.group("teams")
def teams_group() -> None:
    """Teams: DAGs belong to one (`@dag(team=...)`), roles are granted per team."""


@teams_group.command("create")
@click.argument("name")
@click.option("--description", default="")
@pass_context
def create_team_cmd(ctx: Context, name: str, description: str) -> None:
    """Add a team."""
    accounts.create_team(ctx.db, name, description=description, by=_by())
    click.echo(f"created team {name}")


@teams_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def list_teams_cmd(ctx: Context, as_json: bool) -> None:
    """List teams."""
    found = accounts.list_teams(ctx.db)
    if as_json:
        emit_json([{"name": n, "description": d} for n, d in found])
        return
    table("Teams", ["team", "description"], found)


@teams_group.command("add-member")
@click.argument("team")
@click.argument("username")
@click.argument("role", type=ROLE)
@pass_context
def add_member_cmd(ctx: Context, team: str, username: str, role: str) -> None:
    """Give USERNAME ROLE in TEAM (same as `users set-role`)."""
    accounts.set_role(ctx.db, username, team=team, role=Role(role), by=_by())
    click.echo(f"{username}: {role} in {team}")


@cli.command("audit")
@click.option("--since", default=None, help="A duration back from now (12h, 7d) or an ISO time with a zone.")
@click.option(
    "--actor", default=None, help="Only entries by this actor (user:alice, cli:bob, token:3:alice)."
)
@click.option("--action", default=None, help="Only this action (run.trigger, dead_letter.requeue ...).")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def audit_cmd(
    ctx: Context, since: str | None, actor: str | None, action: str | None, limit: int, as_json: bool
) -> None:
    """Show the audit log, newest first."""
    start = _since(ctx, since) if since else None
    found = accounts.list_audit(ctx.db, since=start, actor=actor, action=action, limit=limit)
    if as_json:
        emit_json(found)
        return
    table(
        "Audit log",
        ["at", "actor", "action", "target", "address", "details"],
        [(fmt_time(e.at), e.actor, e.action, e.target, e.address, str(e.details)[:120]) for e in found],
    )


def _since(ctx: Context, text: str) -> datetime:
    if text[:1].isdigit() and text[-1:].lower() in "smhdw" and "-" not in text:
        return accounts.current_time(ctx.db) - parse_duration(text)
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidRequest(f"--since {text!r} is neither a duration (12h, 7d) nor an ISO time") from None
    if at.tzinfo is None:
        raise InvalidRequest(f"--since {text!r} needs a time zone (e.g. 2026-12-01T10:00:00Z)")
    return at
