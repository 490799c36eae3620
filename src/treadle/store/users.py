"""Users, teams, team memberships and API tokens: named queries, Connection in, records out."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.domain.access import Role, TokenRecord, UserRecord
from treadle.store import dialects
from treadle.store.tables import api_tokens, team_memberships, teams, users


def insert_user(
    conn: Connection, *, username: str, password_hash: str, must_change_password: bool, now: datetime
) -> int | None:
    """Add a user; None if the name is taken (also when another process raced us to it)."""
    inserted = conn.execute(
        dialects.insert_ignore(conn, users).values(
            username=username,
            password_hash=password_hash,
            is_active=True,
            must_change_password=must_change_password,
            session_version=1,
            created_at=now,
            updated_at=now,
        )
    ).rowcount
    if not inserted:
        return None
    found = conn.execute(sa.select(users.c.id).where(users.c.username == username)).scalar_one()
    return int(found)


def count_users(conn: Connection) -> int:
    """How many users exist."""
    return int(conn.execute(sa.select(sa.func.count()).select_from(users)).scalar_one())


def get_user(
    conn: Connection, *, user_id: int | None = None, username: str | None = None
) -> UserRecord | None:
    """One user by id or by name, with its memberships; None if there is none."""
    stmt = sa.select(users)
    stmt = (
        stmt.where(users.c.id == user_id) if user_id is not None else stmt.where(users.c.username == username)
    )
    row = conn.execute(stmt).first()
    if row is None:
        return None
    return _user(row, memberships_of(conn, [row.id]).get(row.id, {}))


def list_users(conn: Connection) -> list[UserRecord]:
    """Every user, by name."""
    rows = conn.execute(sa.select(users).order_by(users.c.username)).all()
    grants = memberships_of(conn, [r.id for r in rows])
    return [_user(r, grants.get(r.id, {})) for r in rows]


def _user(row: sa.Row[tuple[object, ...]], memberships: dict[str, Role], *, prefix: str = "") -> UserRecord:
    m = row._mapping
    return UserRecord(
        id=m[f"{prefix}id"],
        username=m[f"{prefix}username"],
        password_hash=m[f"{prefix}password_hash"],
        is_active=bool(m[f"{prefix}is_active"]),
        must_change_password=bool(m[f"{prefix}must_change_password"]),
        session_version=m[f"{prefix}session_version"],
        created_at=m[f"{prefix}created_at"],
        memberships=memberships,
    )


def memberships_of(conn: Connection, user_ids: list[int]) -> dict[int, dict[str, Role]]:
    """user id -> team -> role."""
    if not user_ids:
        return {}
    found: dict[int, dict[str, Role]] = {}
    rows = conn.execute(sa.select(team_memberships).where(team_memberships.c.user_id.in_(user_ids)))
    for r in rows:
        found.setdefault(r.user_id, {})[r.team] = Role(r.role)
    return found


def update_user(conn: Connection, user_id: int, *, now: datetime, **values: object) -> bool:
    """Change a user's password hash / flags and bump its session version (ends its sessions)."""
    stmt = (
        sa.update(users)
        .where(users.c.id == user_id)
        .values(session_version=users.c.session_version + 1, updated_at=now, **values)
    )
    return bool(conn.execute(stmt).rowcount)


def set_membership(conn: Connection, *, user_id: int, team: str, role: Role | None) -> None:
    """Give the user `role` in `team`, or take its membership away (role None)."""
    conn.execute(
        sa.delete(team_memberships).where(
            team_memberships.c.user_id == user_id, team_memberships.c.team == team
        )
    )
    if role is not None:
        conn.execute(sa.insert(team_memberships).values(user_id=user_id, team=team, role=role.value))


def insert_team(conn: Connection, *, name: str, description: str, now: datetime) -> bool:
    """Add a team; False if it exists."""
    stmt = dialects.insert_ignore(conn, teams).values(name=name, description=description, created_at=now)
    return bool(conn.execute(stmt).rowcount)


def list_teams(conn: Connection) -> list[tuple[str, str]]:
    """(name, description) of every team, by name."""
    return [(r.name, r.description) for r in conn.execute(sa.select(teams).order_by(teams.c.name))]


def team_exists(conn: Connection, name: str) -> bool:
    """True if the team was created."""
    return conn.execute(sa.select(teams.c.name).where(teams.c.name == name)).first() is not None


def insert_token(
    conn: Connection,
    *,
    token_hash: str,
    name: str,
    user_id: int,
    team: str,
    role: Role,
    now: datetime,
    expires_at: datetime | None,
) -> int:
    """Store a token's hash and scope; returns its id."""
    conn.execute(
        sa.insert(api_tokens).values(
            token_hash=token_hash,
            name=name,
            user_id=user_id,
            team=team,
            role=role.value,
            created_at=now,
            expires_at=expires_at,
        )
    )
    found = conn.execute(sa.select(api_tokens.c.id).where(api_tokens.c.token_hash == token_hash)).scalar_one()
    return int(found)


def _token_select() -> sa.Select[tuple[object, ...]]:
    return sa.select(api_tokens, users.c.username).select_from(
        api_tokens.join(users, users.c.id == api_tokens.c.user_id)
    )


def _token(row: sa.Row[tuple[object, ...]], *, username_key: str = "username") -> TokenRecord:
    m = row._mapping
    return TokenRecord(
        id=m["id"],
        name=m["name"],
        user_id=m["user_id"],
        username=m[username_key],
        team=m["team"],
        role=Role(m["role"]),
        created_at=m["created_at"],
        expires_at=m["expires_at"],
        revoked_at=m["revoked_at"],
    )


def token_principal(conn: Connection, token_hash: str) -> tuple[TokenRecord, UserRecord, datetime] | None:
    """The token whose secret hashes to `token_hash`, its user with the user's memberships, and
    the database clock, in one statement; None if there is no such token."""
    m = team_memberships.alias("m")
    stmt = (
        sa.select(
            api_tokens,
            *(c.label(f"owner_{c.name}") for c in users.c),
            m.c.team.label("member_team"),
            m.c.role.label("member_role"),
            dialects.clock_sql(conn).label("clock"),
        )
        .select_from(
            api_tokens.join(users, users.c.id == api_tokens.c.user_id).outerjoin(m, m.c.user_id == users.c.id)
        )
        .where(api_tokens.c.token_hash == token_hash)
    )
    rows = conn.execute(stmt).all()
    if not rows:
        return None
    first = rows[0]
    memberships = {r.member_team: Role(r.member_role) for r in rows if r.member_team is not None}
    token = _token(first, username_key="owner_username")
    owner = _user(first, memberships, prefix="owner_")
    return token, owner, dialects.clock_value(conn, first.clock)


def get_token(conn: Connection, token_id: int) -> TokenRecord | None:
    """One token by id, or None."""
    row = conn.execute(_token_select().where(api_tokens.c.id == token_id)).first()
    return _token(row) if row else None


def list_tokens(conn: Connection, *, user_id: int | None = None) -> list[TokenRecord]:
    """Tokens (of one user, or all), newest first."""
    stmt = _token_select().order_by(api_tokens.c.id.desc())
    if user_id is not None:
        stmt = stmt.where(api_tokens.c.user_id == user_id)
    return [_token(r) for r in conn.execute(stmt)]


def revoke_token(conn: Connection, token_id: int, *, now: datetime) -> bool:
    """Revoke a token that is not revoked yet; False if it was (or does not exist)."""
    stmt = (
        sa.update(api_tokens)
        .where(api_tokens.c.id == token_id, api_tokens.c.revoked_at.is_(None))
        .values(revoked_at=now)
    )
    return bool(conn.execute(stmt).rowcount)
