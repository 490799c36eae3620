"""Accounts: users, teams, roles, API tokens and password logins; every change audited.

Passwords are hashed with argon2 and token secrets with sha256 (they are random, so a slow hash
adds nothing); neither the password nor the secret is ever stored or logged.
"""

from __future__ import annotations

import functools
import hashlib
import secrets
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy.engine import Connection

from treadle.domain.access import (
    ALL_TEAMS,
    AuditEntry,
    Principal,
    Role,
    TokenRecord,
    UserRecord,
    password_problem,
    token_grants,
)
from treadle.domain.identifiers import is_identifier
from treadle.errors import (
    AccountConflict,
    AccountNotFound,
    InvalidRequest,
    NotAuthenticated,
    PermissionDenied,
    TooManyAttempts,
)
from treadle.extras import require_web
from treadle.store import audit
from treadle.store import users as user_store
from treadle.store.database import Database, db_now

if TYPE_CHECKING:
    from argon2 import PasswordHasher

#: The user the first start creates.
BOOTSTRAP_ADMIN = "admin"
#: Token secrets start with this, so a leaked one is easy to recognise (and to scan for).
TOKEN_PREFIX = "trd_"


@functools.cache
def _hasher() -> PasswordHasher:
    """argon2's hasher, loaded at first use: the worker, the scheduler and the read commands
    never hash a password, and argon2-cffi comes with the `web` extra."""
    require_web("hashing a password (argon2)")
    from argon2 import PasswordHasher

    return PasswordHasher()


#: How long a token's principal is reused without reading the database again. A token revoked,
#: or a user disabled or demoted, by another process is refused within this; by this process
#: (every account change goes through this module) at once.
TOKEN_CACHE_S = 5.0
#: Most principals the token cache holds (it is emptied when full).
TOKEN_CACHE_SIZE = 10_000


@functools.cache
def _dummy_hash() -> str:
    """Verified against when the user does not exist, so a login takes as long either way.

    Made at first use, not at import: every CLI command imports this module.
    """
    return _hasher().hash(secrets.token_urlsafe(16))


@dataclass(frozen=True, slots=True, kw_only=True)
class LoginLimits:
    """Failed logins allowed per user and per address within a window."""

    per_user: int = 5
    per_address: int = 20
    window_s: float = 300.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Caller:
    """Who asks for an account change, for the audit log."""

    actor: str
    address: str | None = None


def hash_password(password: str) -> str:
    """The argon2 hash of a password."""
    return _hasher().hash(password)


def hash_token(secret: str) -> str:
    """The sha256 (hex) under which a token secret is stored and looked up."""
    return hashlib.sha256(secret.encode()).hexdigest()


def _check_name(kind: str, name: str) -> str:
    if not is_identifier(name) or len(name) > 100:
        raise InvalidRequest(f"{kind} {name!r} must match [A-Za-z0-9._-]{{1,100}}")
    return name


def _check_password(password: str, username: str) -> None:
    problem = password_problem(password, username=username)
    if problem:
        raise InvalidRequest(problem)


def _require_user(conn: Connection, username: str) -> UserRecord:
    found = user_store.get_user(conn, username=username)
    if found is None:
        raise AccountNotFound(f"no user {username!r}")
    return found


def _require_team(conn: Connection, team: str) -> None:
    if team not in ("default", ALL_TEAMS) and not user_store.team_exists(conn, team):
        raise AccountNotFound(f"no team {team!r} (create it with `treadle teams create {team}`)")


def bootstrap_admin(db: Database, *, password: str | None) -> str | None:
    """On a database without users, create `admin` (admin of every team) and return its password.

    The password is `password` (TREADLE_ADMIN_PASSWORD) or a random one; either way it must be
    changed before the account can do anything else. With users present this does nothing and
    returns None, so a restart never resets a password that was changed.
    """
    chosen = password or secrets.token_urlsafe(18)

    def work(conn: Connection) -> str | None:
        if user_store.count_users(conn):
            return None
        now = db_now(conn)
        user_id = user_store.insert_user(
            conn,
            username=BOOTSTRAP_ADMIN,
            password_hash=hash_password(chosen),
            must_change_password=True,
            now=now,
        )
        if user_id is None:
            return None
        user_store.set_membership(conn, user_id=user_id, team=ALL_TEAMS, role=Role.ADMIN)
        audit.record(conn, at=now, actor="system", action="user.bootstrap", target=BOOTSTRAP_ADMIN)
        return chosen

    return db.transact(work)


def has_unchanged_bootstrap_password(db: Database) -> bool:
    """True while the bootstrap admin still has the password it was created with."""
    found = db.query(lambda conn: user_store.get_user(conn, username=BOOTSTRAP_ADMIN))
    return found is not None and found.is_active and found.must_change_password


def create_user(
    db: Database, username: str, password: str, *, team: str, role: Role, by: Caller, temporary: bool = False
) -> UserRecord:
    """Add a user with `role` in `team`; `temporary`: the password must be changed at first use."""
    _check_name("user name", username)
    _check_password(password, username)

    def work(conn: Connection) -> UserRecord:
        _require_team(conn, team)
        now = db_now(conn)
        user_id = user_store.insert_user(
            conn,
            username=username,
            password_hash=hash_password(password),
            must_change_password=temporary,
            now=now,
        )
        if user_id is None:
            raise AccountConflict(f"user {username!r} exists already")
        user_store.set_membership(conn, user_id=user_id, team=team, role=role)
        audit.record(
            conn,
            at=now,
            actor=by.actor,
            action="user.create",
            target=username,
            details={"team": team, "role": role.value, "temporary": temporary},
            address=by.address,
        )
        found = user_store.get_user(conn, user_id=user_id)
        assert found is not None
        return found

    return db.transact(work)


def list_users(db: Database) -> list[UserRecord]:
    """Every user with its roles."""
    return db.query(user_store.list_users)


def get_user(db: Database, user_id: int) -> UserRecord | None:
    """One user by id."""
    return db.query(lambda conn: user_store.get_user(conn, user_id=user_id))


def set_role(db: Database, username: str, *, team: str, role: Role | None, by: Caller) -> UserRecord:
    """Give `username` `role` in `team` (None removes it); the user's sessions end (S7)."""

    def work(conn: Connection) -> UserRecord:
        found = _require_user(conn, username)
        _require_team(conn, team)
        now = db_now(conn)
        user_store.set_membership(conn, user_id=found.id, team=team, role=role)
        user_store.update_user(conn, found.id, now=now)
        audit.record(
            conn,
            at=now,
            actor=by.actor,
            action="user.set_role",
            target=username,
            details={"team": team, "role": role.value if role else None},
            address=by.address,
        )
        updated = user_store.get_user(conn, user_id=found.id)
        assert updated is not None
        return updated

    try:
        return db.transact(work)
    finally:
        _forget_principals(db)


def set_active(db: Database, username: str, *, active: bool, by: Caller) -> None:
    """Disable (or enable again) a user: a disabled user's sessions and tokens stop working."""

    def work(conn: Connection) -> None:
        found = _require_user(conn, username)
        now = db_now(conn)
        user_store.update_user(conn, found.id, now=now, is_active=active)
        action = "user.enable" if active else "user.disable"
        audit.record(conn, at=now, actor=by.actor, action=action, target=username, address=by.address)

    try:
        db.transact(work)
    finally:
        _forget_principals(db)


def end_sessions(db: Database, username: str, *, by: Caller) -> None:
    """End every browser session of a user (logging out): its session version moves on."""

    def work(conn: Connection) -> None:
        found = _require_user(conn, username)
        now = db_now(conn)
        user_store.update_user(conn, found.id, now=now)
        audit.record(conn, at=now, actor=by.actor, action="auth.logout", target=username, address=by.address)

    try:
        db.transact(work)
    finally:
        _forget_principals(db)


def set_password(
    db: Database,
    username: str,
    new_password: str,
    *,
    by: Caller,
    current_password: str | None = None,
    temporary: bool = False,
) -> int:
    """Change a password; every session of the user ends. Returns the new session version.

    With `current_password` (a user changing their own), it must match.
    """
    _check_password(new_password, username)

    def work(conn: Connection) -> int:
        found = _require_user(conn, username)
        if current_password is not None and not _verify(found.password_hash, current_password):
            raise PermissionDenied("the current password is wrong")
        if _verify(found.password_hash, new_password):
            raise InvalidRequest("the new password must differ from the current one")
        now = db_now(conn)
        user_store.update_user(
            conn, found.id, now=now, password_hash=hash_password(new_password), must_change_password=temporary
        )
        audit.record(
            conn, at=now, actor=by.actor, action="user.set_password", target=username, address=by.address
        )
        return found.session_version + 1

    try:
        return db.transact(work)
    finally:
        _forget_principals(db)


def _verify(password_hash: str, password: str) -> bool:
    hasher = _hasher()
    from argon2.exceptions import InvalidHashError, VerificationError

    try:
        return hasher.verify(password_hash, password)
    except (VerificationError, InvalidHashError):
        return False


def log_in(
    db: Database, username: str, password: str, *, address: str | None, limits: LoginLimits
) -> UserRecord:
    """Check a password login: TooManyAttempts past the limits, NotAuthenticated if wrong.

    Failures are audited (`auth.login_failed`), and the limits count those entries, so every
    API process shares them.
    """

    def throttle(conn: Connection) -> None:
        now = db_now(conn)
        since = now - timedelta(seconds=limits.window_s)
        by_user = audit.count_recent(conn, action="auth.login_failed", since=since, target=username)
        by_address = (
            audit.count_recent(conn, action="auth.login_failed", since=since, address=address)
            if address
            else 0
        )
        if by_user >= limits.per_user or by_address >= limits.per_address:
            raise TooManyAttempts(retry_after_s=int(limits.window_s))

    try:
        db.query(throttle)
    except TooManyAttempts:
        _record_login(db, username, address=address, outcome="auth.login_throttled")
        raise
    found = db.query(lambda conn: user_store.get_user(conn, username=username))
    ok = _verify(found.password_hash if found else _dummy_hash(), password)
    if found is None or not ok or not found.is_active:
        _record_login(db, username, address=address, outcome="auth.login_failed")
        raise NotAuthenticated("wrong user name or password")
    _record_login(db, username, address=address, outcome="auth.login")
    return found


def _record_login(db: Database, username: str, *, address: str | None, outcome: str) -> None:
    """Audit a login attempt: `auth.login`, `auth.login_failed` or `auth.login_throttled`."""

    def work(conn: Connection) -> None:
        actor = f"user:{username}"
        audit.record(conn, at=db_now(conn), actor=actor, action=outcome, target=username, address=address)

    db.transact(work)


def principal_for_session(db: Database, user_id: int, *, session_version: int) -> Principal | None:
    """The principal of a browser session, or None if the session ended (version, disabled user)."""
    found = db.query(lambda conn: user_store.get_user(conn, user_id=user_id))
    if found is None or not found.is_active or found.session_version != session_version:
        return None
    return Principal(
        user_id=found.id,
        username=found.username,
        grants=dict(found.memberships),
        must_change_password=found.must_change_password,
    )


def cached_token_principal(db: Database, secret: str) -> Principal | None:
    """The principal `principal_for_token` keeps for a usable token, while it keeps it; None if
    it keeps none (the token may still be usable: `principal_for_token` reads it). No database
    call, so an event loop may call it."""
    return _cached_principal(db, hash_token(secret))


def _cached_principal(db: Database, token_hash: str) -> Principal | None:
    cached = db.principal_cache.get(token_hash)
    if cached is None:
        return None
    if time.monotonic() < cached[0]:
        return cached[1]
    db.principal_cache.pop(token_hash, None)
    return None


def principal_for_token(db: Database, secret: str) -> Principal | None:
    """The principal of an API token, or None if unknown, revoked, expired or its user disabled.

    A usable token's principal is kept `TOKEN_CACHE_S` seconds (never past the token's expiry);
    every account change made through this module forgets them all.
    """
    token_hash = hash_token(secret)
    cached = _cached_principal(db, token_hash)
    if cached is not None:
        return cached
    generation = db.principal_generation
    started = time.monotonic()
    found = db.query(lambda conn: user_store.token_principal(conn, token_hash))
    if found is None:
        return None
    token, owner, now = found
    if not token.is_usable(now) or not owner.is_active:
        return None
    principal = Principal(
        user_id=owner.id,
        username=owner.username,
        grants=token_grants(owner.memberships, team=token.team, role=token.role),
        token_id=token.id,
        must_change_password=owner.must_change_password,
    )
    keep_s = TOKEN_CACHE_S
    if token.expires_at is not None:
        keep_s = min(keep_s, (token.expires_at - now).total_seconds())
    # Not kept if an account changed while it was read: it may predate the change.
    if db.principal_generation == generation:
        if len(db.principal_cache) >= TOKEN_CACHE_SIZE:
            db.principal_cache.clear()
        db.principal_cache[token_hash] = (started + keep_s, principal)
    return principal


def _forget_principals(db: Database) -> None:
    """Forget every cached token principal (after an account change, which may end or narrow one)."""
    db.principal_generation += 1
    db.principal_cache.clear()


def create_token(
    db: Database,
    username: str,
    *,
    name: str,
    team: str,
    role: Role,
    expires_in: timedelta | None,
    by: Caller,
) -> tuple[str, TokenRecord]:
    """Make an API token for `username`, scoped to `team` and `role`; returns (secret, record).

    The secret is returned this once and never stored. The role may not exceed the user's own
    role in that team.
    """
    _check_name("token name", name)
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)

    def work(conn: Connection) -> TokenRecord:
        owner = _require_user(conn, username)
        _require_team(conn, team)
        held = [r for t, r in owner.memberships.items() if t in (team, ALL_TEAMS)]
        if not any(r.includes(role) for r in held):
            raise PermissionDenied(
                f"user {username!r} is not {role.value} in team {team!r}, so no token can be"
            )
        now = db_now(conn)
        expires_at = now + expires_in if expires_in is not None else None
        token_id = user_store.insert_token(
            conn,
            token_hash=hash_token(secret),
            name=name,
            user_id=owner.id,
            team=team,
            role=role,
            now=now,
            expires_at=expires_at,
        )
        audit.record(
            conn,
            at=now,
            actor=by.actor,
            action="token.create",
            target=f"{username}/{name}",
            details={"token_id": token_id, "team": team, "role": role.value, "expires_at": str(expires_at)},
            address=by.address,
        )
        record = user_store.get_token(conn, token_id)
        assert record is not None
        return record

    return secret, db.transact(work)


def list_tokens(db: Database, *, username: str | None = None) -> list[TokenRecord]:
    """Tokens of one user (or every token), newest first; secrets are never shown again."""

    def work(conn: Connection) -> list[TokenRecord]:
        user_id = _require_user(conn, username).id if username is not None else None
        return user_store.list_tokens(conn, user_id=user_id)

    return db.query(work)


def get_token(db: Database, token_id: int) -> TokenRecord | None:
    """One token by id."""
    return db.query(lambda conn: user_store.get_token(conn, token_id))


def revoke_token(db: Database, token_id: int, *, by: Caller) -> None:
    """Revoke a token; AccountNotFound if there is no such token or it is revoked already."""

    def work(conn: Connection) -> None:
        now = db_now(conn)
        if not user_store.revoke_token(conn, token_id, now=now):
            raise AccountNotFound(f"no unrevoked token {token_id}")
        audit.record(
            conn, at=now, actor=by.actor, action="token.revoke", target=str(token_id), address=by.address
        )

    try:
        db.transact(work)
    finally:
        _forget_principals(db)


def create_team(db: Database, name: str, *, description: str = "", by: Caller) -> None:
    """Add a team."""
    if not is_identifier(name):
        raise InvalidRequest(f"team {name!r} must match [A-Za-z0-9._-]{{1,250}}")

    def work(conn: Connection) -> None:
        now = db_now(conn)
        if name == "default" or not user_store.insert_team(conn, name=name, description=description, now=now):
            raise AccountConflict(f"team {name!r} exists already")
        audit.record(conn, at=now, actor=by.actor, action="team.create", target=name, address=by.address)

    db.transact(work)


def list_teams(db: Database) -> list[tuple[str, str]]:
    """(name, description) of every team, `default` first."""
    created = db.query(user_store.list_teams)
    return [("default", "every DAG that names no team"), *created]


def current_time(db: Database) -> datetime:
    """The database clock."""
    return db.query(db_now)


def list_audit(
    db: Database,
    *,
    since: datetime | None = None,
    actor: str | None = None,
    action: str | None = None,
    before_id: int | None = None,
    limit: int = 100,
) -> list[AuditEntry]:
    """Audit entries newest first, filtered; `before_id` continues from a previous page."""
    return db.query(
        lambda conn: audit.list_entries(
            conn, since=since, actor=actor, action=action, before_id=before_id, limit=limit
        )
    )
