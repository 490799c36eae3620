"""Idempotency-Key: a retried request gets the first one's response, and its change is made once.

The key is claimed inside the transaction that makes the change (the use case's own, joined
through `Database.enlisted`): the claim commits with the run, backfill or requeue, or rolls back
with it. So a claim row exists only once its change committed, and of two requests with one key
the primary key lets exactly one commit. The response is recorded in that same transaction,
just before its commit, when the transaction's value is the response's (the trigger's run);
otherwise just after, in a short transaction of its own, and a retry meanwhile is told to wait
(409).
"""

from __future__ import annotations

import functools
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy.engine import Connection

from treadle.domain.idempotency import HEADER, IdempotentRequest
from treadle.errors import IdempotencyKeyInProgress, IdempotencyKeyReused
from treadle.store import idempotency as key_store
from treadle.store.database import Database, db_now

T = TypeVar("T")
#: Expired keys deleted per transaction.
PRUNE_BATCH = 1000


@dataclass(frozen=True, slots=True, kw_only=True)
class Response:
    """What a request with a key answered: its status and JSON body."""

    status_code: int
    body: Any  # Any: the JSON body
    #: True when this is the recorded answer of an earlier request, not a new one.
    replayed: bool


class _Taken(Exception):
    """Another request committed a claim of the key first (control flow inside this module)."""


def recorded_response(db: Database, request: IdempotentRequest) -> Response | None:
    """The response recorded for the key, or None when the key is free (never used, or expired).

    Raises IdempotencyKeyReused when the key was used for a different request, and
    IdempotencyKeyInProgress when its first request has not recorded its response yet.
    """

    found = db.query(lambda conn: key_store.get_key_and_clock(conn, request.key_hash))
    if found is None:
        return None
    row, now = found
    if row.expires_at <= now:
        return None
    if row.fingerprint != request.fingerprint:
        what = (
            "with a different body" if row.request_line == request.request_line else f"for {row.request_line}"
        )
        raise IdempotencyKeyReused(
            f"{HEADER} {request.key!r} was used at {row.created_at.isoformat()} {what}; "
            "a new request needs a new key"
        )
    if row.status_code is None:
        raise IdempotencyKeyInProgress(
            f"the request that first sent {HEADER} {request.key!r} has not answered yet; retry in a moment"
        )
    return Response(status_code=row.status_code, body=row.response, replayed=True)


def respond_once(
    db: Database,
    request: IdempotentRequest,
    *,
    make: Callable[[], T],
    answer: Callable[[T], tuple[int, Any]],
    result_type: type[T] | None = None,
) -> Response:
    """Answer a request with an Idempotency-Key: the recorded response of the key, or `make()`'s.

    `make` runs the use case; its first write transaction carries the key's claim. `answer`
    turns its result into (status, JSON body), which is recorded for retries until the key
    expires. When that transaction returns a `result_type` value, its answer is recorded in the
    transaction itself, before the commit; if `make` then returns something else, the recorded
    answer is corrected just after. An error from `make` records nothing: its change rolled back
    with the claim, so a retry may succeed. A change that committed but whose response could
    not be recorded (the process died in between) keeps the key claimed: retries get 409,
    never a second change.
    """
    # A replay is answered before `make` runs: a use case may refuse, once its change is made,
    # what its first request did (a requeue of an instance that moved on).
    found = recorded_response(db, request)
    if found is not None:
        return found
    claim = secrets.token_hex(16)
    #: The answer recorded with the change (absent: none, or its transaction rolled back).
    recorded: dict[str, tuple[int, Any]] = {}

    def record_with_change(conn: Connection, value: Any) -> None:
        recorded.clear()  # a retried transaction records again
        if result_type is None or not isinstance(value, result_type):
            return
        status_code, body = answer(value)
        if key_store.record_response(
            conn, key_hash=request.key_hash, claim=claim, status_code=status_code, response=body
        ):
            recorded["answer"] = (status_code, body)

    try:
        with db.enlisted(
            functools.partial(_claim, request=request, claim=claim), finish=record_with_change
        ) as enlistment:
            result = make()
    except _Taken:
        found = recorded_response(db, request)
        if found is None:
            raise IdempotencyKeyInProgress(
                f"another request with {HEADER} {request.key!r} is being answered; retry in a moment"
            ) from None
        return found
    status_code, body = answer(result)
    if enlistment.committed and recorded.get("answer") != (status_code, body):
        db.transact(
            lambda conn: key_store.record_response(
                conn,
                key_hash=request.key_hash,
                claim=claim,
                status_code=status_code,
                response=body,
                replace="answer" in recorded,
            )
        )
    return Response(status_code=status_code, body=body, replayed=False)


def _claim(conn: Connection, *, request: IdempotentRequest, claim: str) -> None:
    """Claim the key in the change's transaction, or raise _Taken (rolling the change back)."""
    now = db_now(conn)

    def insert() -> bool:
        return key_store.insert_claim(
            conn,
            key_hash=request.key_hash,
            fingerprint=request.fingerprint,
            request_line=request.request_line,
            claim=claim,
            now=now,
            expires_at=now + request.retention,
        )

    if insert():
        return
    # An expired key is free again. Two requests reviving it both delete, one inserts: the
    # other's insert skips and it is refused like any loser.
    if key_store.delete_if_expired(conn, request.key_hash, now=now) and insert():
        return
    raise _Taken()  # held by another request, whose change committed with its claim


class ExpiredKeys:
    """Deletes expired keys from a long-running process, at most once per `interval_s`."""

    def __init__(self, *, interval_s: float = 300.0) -> None:
        self.interval_s = interval_s
        self._next_at = 0.0
        self._lock = threading.Lock()

    def prune_if_due(self, db: Database) -> int:
        """Delete a batch of expired keys if the interval has passed; how many were deleted."""
        with self._lock:
            if time.monotonic() < self._next_at:
                return 0
            self._next_at = time.monotonic() + self.interval_s
        return prune_expired(db)


def prune_expired(db: Database, *, limit: int = PRUNE_BATCH) -> int:
    """Delete up to `limit` expired keys; how many were deleted."""
    return db.transact(lambda conn: key_store.delete_expired(conn, now=db_now(conn), limit=limit))
