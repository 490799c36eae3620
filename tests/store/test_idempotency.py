"""Idempotency-Key rows on every database, and a claim joining the next write transaction."""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa

from treadle.store import idempotency as keys
from treadle.store.database import Database, db_now
from treadle.store.tables import audit_log, idempotency_keys


def _claim(db: Database, claim: str, *, ttl: timedelta = timedelta(hours=1)) -> bool:
    def work(conn: sa.Connection) -> bool:
        now = db_now(conn)
        return keys.insert_claim(
            conn,
            key_hash="h",
            fingerprint="f",
            request_line="POST /x",
            claim=claim,
            now=now,
            expires_at=now + ttl,
        )

    return db.transact(work)


def test_one_claim_holds_a_key_and_its_response_is_recorded_once(db: Database) -> None:
    assert _claim(db, "first") is True
    assert _claim(db, "second") is False
    with db.begin() as conn:
        assert keys.record_response(conn, key_hash="h", claim="second", status_code=201, response={}) is False
        assert keys.record_response(conn, key_hash="h", claim="first", status_code=201, response={"id": 1})
        assert keys.record_response(conn, key_hash="h", claim="first", status_code=500, response={}) is False
    row = db.query(lambda conn: keys.get_key(conn, "h"))
    assert row is not None and (row.claim, row.status_code, row.response) == ("first", 201, {"id": 1})
    assert row.request_line == "POST /x" and row.expires_at > row.created_at


def test_expired_keys_are_counted_and_deleted_in_batches(db: Database) -> None:
    assert _claim(db, "old", ttl=timedelta(seconds=-1))
    now = db.query(db_now)
    assert db.query(lambda conn: keys.count_expired(conn, now=now)) == 1
    with db.begin() as conn:
        assert keys.delete_if_expired(conn, "h", now=now) is True
    assert _claim(db, "new") is True
    with db.begin() as conn:
        assert keys.delete_if_expired(conn, "h", now=now) is False
        assert keys.delete_expired(conn, now=now + timedelta(hours=2), limit=10) == 1


def test_an_enlisted_write_commits_and_rolls_back_with_the_next_write_transaction(db: Database) -> None:
    def note(conn: sa.Connection) -> None:
        conn.execute(
            sa.insert(audit_log).values(at=db_now(conn), actor="t", action="joined", target="x", details={})
        )

    def joined() -> int:
        stmt = sa.select(sa.func.count()).select_from(audit_log).where(audit_log.c.action == "joined")
        return int(db.query(lambda conn: conn.execute(stmt).scalar_one()))

    with db.enlisted(note) as enlistment, pytest.raises(ValueError), db.begin():
        raise ValueError("refused")
    assert enlistment.spent and not enlistment.committed and joined() == 0
    with db.enlisted(note) as enlistment:
        db.query(lambda conn: conn.execute(sa.select(idempotency_keys.c.key_hash)).all())  # reads never join
        db.transact(lambda conn: None)
        db.transact(lambda conn: None)  # spent: the second transaction runs without it
    assert enlistment.committed and joined() == 1
    db.transact(lambda conn: None)
    assert joined() == 1
