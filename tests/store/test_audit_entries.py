"""Audit entries of a transaction: written together just before the commit, in the order they
were recorded; none when the transaction rolls back."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from treadle.store import audit
from treadle.store.database import Database, db_now
from treadle.store.tables import audit_log


def _actions(db: Database) -> list[str]:
    return db.query(
        lambda conn: list(conn.execute(sa.select(audit_log.c.action).order_by(audit_log.c.id)).scalars())
    )


def test_a_transactions_entries_are_written_together_in_order_and_not_on_rollback(db: Database) -> None:
    with db.begin() as conn:
        for n in range(3):
            audit.record(conn, at=db_now(conn), actor="tester", action=f"test.{n}", target="t")
        # Not written yet: the transaction writes its entries together as it ends.
        unwritten = conn.execute(sa.select(sa.func.count()).select_from(audit_log)).scalar_one()
    assert unwritten == 0
    assert _actions(db) == ["test.0", "test.1", "test.2"]

    with pytest.raises(RuntimeError), db.begin() as conn:
        audit.record(conn, at=db_now(conn), actor="tester", action="test.rolled_back", target="t")
        raise RuntimeError("refused")
    # The next transaction on the pooled connection starts with no entry left over.
    db.transact(lambda conn: audit.record(conn, at=db_now(conn), actor="tester", action="test.3", target="t"))
    assert _actions(db) == ["test.0", "test.1", "test.2", "test.3"]
