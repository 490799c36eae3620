"""Managing pools (recorded in the audit log)."""

from __future__ import annotations

from sqlalchemy.engine import Connection

from treadle.domain.identifiers import is_identifier
from treadle.errors import InvalidRequest
from treadle.store import audit
from treadle.store import pools as pool_store
from treadle.store.database import Database, db_now
from treadle.store.pools import PoolInfo

MAX_POOL_SLOTS = 1_000_000


def set_pool(db: Database, name: str, *, slots: int, description: str | None, actor: str) -> bool:
    """Create or resize a pool; returns True if created. 0 slots holds the pool's tasks back."""
    if not is_identifier(name):
        raise InvalidRequest(f"pool name {name!r} must match [A-Za-z0-9._-]{{1,250}}")
    if not 0 <= slots <= MAX_POOL_SLOTS:
        raise InvalidRequest(f"pool slots must be between 0 and {MAX_POOL_SLOTS}, got {slots}")

    def work(conn: Connection) -> bool:
        now = db_now(conn)
        created = pool_store.upsert_pool(conn, name=name, slots=slots, description=description, now=now)
        audit.record(
            conn,
            at=now,
            actor=actor,
            action="pool.created" if created else "pool.resized",
            target=f"pool:{name}",
            details={"slots": slots},
        )
        return created

    return db.transact(work, retry_conflicts=True)


def delete_pool(db: Database, name: str, *, actor: str, force: bool = False) -> None:
    """Delete a pool. Refused while task instances use it, unless `force` (they then wait)."""

    def work(conn: Connection) -> None:
        running, queued = pool_store.pool_demand(conn, name)
        if (running or queued) and not force:
            raise InvalidRequest(
                f"pool {name!r} is used by {running} running and {queued} queued task instance(s); "
                "those queued could not start until it is created again (use --force to delete anyway)"
            )
        if not pool_store.delete_pool(conn, name):
            raise InvalidRequest(f"no pool {name!r}")
        audit.record(
            conn,
            at=db_now(conn),
            actor=actor,
            action="pool.deleted",
            target=f"pool:{name}",
            details={"running": running, "queued": queued},
        )

    db.transact(work)


def list_pools(db: Database) -> list[PoolInfo]:
    """Every pool with its use."""
    return db.query(pool_store.list_pools)
