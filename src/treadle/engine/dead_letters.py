"""Dead letters: list them (grouped by error fingerprint) and requeue them with a fresh budget."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from sqlalchemy.engine import Connection

from treadle.domain.states import TaskState
from treadle.domain.task_records import AttemptInfo, TaskInstanceInfo
from treadle.domain.transitions import UseCase
from treadle.engine.mapping import release_held_back
from treadle.engine.propagation import settle
from treadle.engine.runs import reopen_run
from treadle.engine.versions import version_of
from treadle.errors import InvalidRequest, TaskInstanceNotFound
from treadle.store import attempts as attempt_store
from treadle.store import audit, dialects
from treadle.store import mapping as mapping_store
from treadle.store import readiness as readiness_store
from treadle.store import runs as run_store
from treadle.store import task_instances as ti_store
from treadle.store.database import Database, db_now


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetter:
    """A dead-lettered task instance with its last attempt."""

    task_instance: TaskInstanceInfo
    last_attempt: AttemptInfo | None

    @property
    def fingerprint(self) -> str:
        """The last attempt's error fingerprint."""
        return (self.last_attempt.fingerprint if self.last_attempt else None) or "-"


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetterGroup:
    """Dead letters sharing one fingerprint."""

    fingerprint: str
    error_type: str
    message: str
    count: int
    dag_ids: tuple[str, ...]
    task_instance_ids: tuple[int, ...]


def list_dead_letters(db: Database, *, limit: int = 1000) -> list[DeadLetter]:
    """Return dead letters, newest first, each with its last attempt."""

    def work(conn: Connection) -> list[DeadLetter]:
        tis = ti_store.list_dead_letters(conn, limit=limit)
        last = attempt_store.last_attempts(conn, [t.id for t in tis])
        return [DeadLetter(task_instance=t, last_attempt=last.get(t.id)) for t in tis]

    return db.query(work)


def group_dead_letters(letters: list[DeadLetter]) -> list[DeadLetterGroup]:
    """Group dead letters by fingerprint, biggest group first."""
    groups: dict[str, list[DeadLetter]] = defaultdict(list)
    for d in letters:
        groups[d.fingerprint].append(d)
    result = []
    for fp, items in groups.items():
        last = items[0].last_attempt
        result.append(
            DeadLetterGroup(
                fingerprint=fp,
                error_type=(last.error_type if last else None) or "-",
                message=((last.error_message if last else None) or "")[:200],
                count=len(items),
                dag_ids=tuple(sorted({d.task_instance.dag_id for d in items})),
                task_instance_ids=tuple(d.task_instance.id for d in items),
            )
        )
    return sorted(result, key=lambda g: (-g.count, g.fingerprint))


def requeue_dead_letter(
    db: Database, task_instance_id: int, *, actor: str = "system", address: str | None = None
) -> TaskInstanceInfo:
    """Queue a dead letter again with a fresh retry budget; its downstream and run reopen.

    Its downstream rows that failed because of it wait again, and every waiting row after it
    has its trigger rule applied anew (`propagation.settle`). A mapped task whose expansion
    failed expands again instead of being queued.

    Audited (`dead_letter.requeue`, by `actor`) in the same transaction.

    A reopener of the run open/close protocol: the task-instance writes first, then
    `reopen_run` locks the run and reopens it in the same transaction. A dead letter of a
    cancelled run is refused (RunCancelledError): `tasks clear` reopens such a run explicitly.
    """

    def work(conn: Connection) -> TaskInstanceInfo:
        found = ti_store.get_task_instance(conn, task_instance_id)
        if found is None:
            raise TaskInstanceNotFound(f"no task instance {task_instance_id}")
        if found.state != TaskState.DEAD_LETTER.value:
            raise InvalidRequest(f"task instance {task_instance_id} is {found.state}, not dead_letter")
        now = db_now(conn)
        run = run_store.get_run(conn, found.run_id)
        assert run is not None
        version = version_of(db, conn, run.dag_version_id)
        # A mapped task that failed to expand is not run: it goes back to waiting and expands again.
        definition = version.structure.tasks[found.task_id]
        unexpanded = found.map_index < 0 and definition.map_arg is not None
        # A mapped instance under max_active_mapped is held back; it goes when there is room.
        limit = definition.max_active_mapped if found.map_index >= 0 else None
        if limit is not None:
            moved = mapping_store.requeue_held_back(
                conn, task_instance_id=task_instance_id, now=now, by=UseCase.REQUEUE
            )
        else:
            requeue = readiness_store.requeue_to_waiting if unexpanded else ti_store.requeue_dead_letter
            moved = requeue(conn, task_instance_id=task_instance_id, now=now)
        if not moved:
            raise InvalidRequest(
                f"task instance {task_instance_id} changed while it was being requeued; nothing was "
                "applied (look at it again with `treadle runs show`)"
            )
        downstream = version.all_downstream(found.task_id)
        ti_store.reset_to_pending(conn, run_id=found.run_id, task_ids=downstream)
        # Rows after it counted its failure: recount them and apply their rules again.
        settle(db, conn, version, found.run_id, [found.task_id, *downstream], now=now)
        if limit is not None:
            release_held_back(conn, run_id=found.run_id, task_id=found.task_id, max_active=limit, now=now)
        reopen_run(conn, found.run_id, now=now, requeued_task=found.task_id)
        audit.record(
            conn,
            at=now,
            actor=actor,
            action="dead_letter.requeue",
            target=f"{found.run_id}/{found.task_id}",
            details={"task_instance_id": task_instance_id},
            address=address,
        )
        dialects.notify_ready(conn)
        updated = ti_store.get_task_instance(conn, task_instance_id)
        assert updated is not None
        return updated

    return db.transact(work)


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupRequeue:
    """What requeueing a fingerprint did: the instances requeued, and those refused with why."""

    requeued: list[TaskInstanceInfo]
    refused: list[tuple[int, str]]


def requeue_fingerprint(
    db: Database, fp: str, *, actor: str = "system", address: str | None = None
) -> GroupRequeue:
    """Requeue every dead letter whose last attempt has this fingerprint.

    One refused requeue (a cancelled run, an instance that moved) does not stop the others; it
    is reported with its reason.
    """
    ids = [d.task_instance.id for d in list_dead_letters(db) if d.fingerprint == fp]
    if not ids:
        raise InvalidRequest(f"no dead letter has fingerprint {fp!r}")
    requeued, refused = [], []
    for i in ids:
        try:
            requeued.append(requeue_dead_letter(db, i, actor=actor, address=address))
        except InvalidRequest as exc:
            refused.append((i, str(exc)))
    return GroupRequeue(requeued=requeued, refused=refused)
