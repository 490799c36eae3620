"""A slot's side of sensors and submit-then-poll tasks: the poke request and what its reply means.

The request carries what the last poke left (`engine.sensing.poke_start`, on the database's
clock: the state, whether this poke is the final one). A reply whose value is a poke answer
(`authoring.sensing`) asks for a reschedule or says the timeout passed: both are recorded here
and the slot is free. A "ready" answer becomes an ordinary success (its evidence recorded as the
attempt's outputs); anything else is an ordinary reply.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any

from treadle.authoring.sensing import POKE_KEY
from treadle.domain.dag_version import DagVersion, TaskDef
from treadle.domain.sensing import PokeKind
from treadle.domain.task_records import AttemptError, ClaimedTask
from treadle.engine.execution import Ending, Reschedule
from treadle.engine.sensing import (
    ORPHANED_JOB,
    owe_job_cancel,
    poke_start,
    reschedule_attempt,
    time_out_sensor,
)
from treadle.store.database import Database
from treadle.worker.protocol import Message

if TYPE_CHECKING:
    from treadle.worker.slot import Running, Slot

log = logging.getLogger("treadle.worker")


def job_ended(definition: TaskDef, error: AttemptError) -> bool:
    """True if a submit-then-poll task's failure says its job ended (a retry submits anew)."""
    spec = definition.sensor
    return spec is not None and spec.kind is PokeKind.DEFERRED and error.error_type == "JobFailed"


def poke_evidence(answer: dict[str, Any]) -> dict[str, Any] | None:
    """The outputs a poke's evidence is recorded as (None: it gave none)."""
    evidence = answer.get("evidence")
    return {"evidence": evidence} if isinstance(evidence, dict) and evidence else None


def poke_request(
    db: Database, task: ClaimedTask, message: Message, version: DagVersion | None = None
) -> Message:
    """The run request of a poke: `message` with the state the last poke left and whether this
    poke is the final one (on the database's clock)."""
    start = poke_start(db, task, version)
    return message | {
        "poke": {
            "state": start.state,
            "final": start.final,
            "first_poke_at": start.first_poke_at.isoformat() if start.first_poke_at else None,
        }
    }


def poke_answer(outcome: Message) -> tuple[str, Message]:
    """What a poke's reply says: ("wait" | "timeout", the answer) to record as such, ("ready",
    the plain success it stands for, evidence as outputs), or ("reply", as it came)."""
    answer = outcome.get("value") if outcome.get("ok") else None
    if not isinstance(answer, dict) or POKE_KEY not in answer:
        return "reply", outcome
    kind = answer[POKE_KEY]
    if kind == "ready":
        ready = {k: v for k, v in outcome.items() if k != "value"} | {"value": answer.get("value")}
        evidence = poke_evidence(answer)
        return "ready", ready | {"outputs": evidence} if evidence else ready
    return ("wait" if kind == "wait" else "timeout"), answer


def _first_poke_at(request: Message) -> datetime | None:
    """The first poke's time the request carried (None: this is the first)."""
    first = (request.get("poke") or {}).get("first_poke_at")
    return datetime.fromisoformat(first) if isinstance(first, str) else None


class Pokes:
    """Builds a slot's poke requests and records the answers that are not a plain success."""

    def __init__(self, slot: Slot) -> None:
        self.slot = slot

    def message(self, task: ClaimedTask, message: Message) -> Message:
        """The run request of a poke: with the state the last poke left."""
        return poke_request(self.slot.db, task, message, self.slot.version(task.dag_version_id))

    def take(
        self, current: Running, definition: TaskDef, request: Message, outcome: Message
    ) -> Message | None:
        """Record a reschedule or a timeout (None: done); otherwise the reply the slot records,
        a poke's "ready" turned into the plain success it stands for."""
        kind, answer = poke_answer(outcome)
        if kind in ("reply", "ready"):
            return answer
        slot = self.slot
        submitted = kind == "wait" and bool(answer.get("submitted"))
        code_version = outcome.get("code_version") if isinstance(outcome.get("code_version"), str) else None
        if kind == "wait" and slot.reschedule is not None:
            # The worker's next pass records it (confirming the start first if need be); the
            # slot is free at once.
            slot.reschedule(
                Reschedule(
                    task=current.task,
                    state=answer.get("state"),
                    evidence=poke_evidence(answer),
                    code_version=code_version,
                    first_poke_at=_first_poke_at(request),
                    submitted=submitted,
                )
            )
            return None
        if not slot._await_confirmation(current):  # the start was refused: the attempt is not ours
            if submitted:
                self._orphaned(current.task, definition, answer.get("state"))
            return None
        task = current.task
        if kind == "wait":
            ending = slot._record(
                task,
                lambda: reschedule_attempt(
                    slot.db,
                    task,
                    worker_id=slot.worker_id,
                    hostname=slot.hostname,
                    state=answer.get("state"),
                    evidence=poke_evidence(answer),
                    code_version=code_version,
                    first_poke_at=_first_poke_at(request),
                ),
            )
            if ending is not None and not ending.applied and submitted:
                self._orphaned(task, definition, answer.get("state"))
            return None
        slot._record(
            task,
            lambda: time_out_sensor(
                slot.db,
                task,
                worker_id=slot.worker_id,
                hostname=slot.hostname,
                evidence=poke_evidence(answer),
                code_version=code_version,
            ),
        )
        return None

    def _orphaned(self, task: ClaimedTask, definition: TaskDef, handle: Any) -> None:
        """A job was submitted by an attempt this worker no longer holds: nobody will poll it, so
        a worker must cancel it."""
        log.warning(
            "submitted job of a lost attempt; owing its cancel",
            extra={
                "event": "job.orphaned",
                "task_instance_id": task.task_instance_id,
                "attempt": task.attempt,
            },
        )
        self.slot._record(
            task,
            lambda: _owe(self.slot, task, definition, handle),
        )


def _owe(slot: Slot, task: ClaimedTask, definition: TaskDef, handle: Any) -> Ending:
    owe_job_cancel(
        slot.db,
        task,
        handle=handle,
        queue=definition.queue,
        reason=ORPHANED_JOB,
    )
    return Ending(applied=True)
