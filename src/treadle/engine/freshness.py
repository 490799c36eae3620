"""The leader's freshness check: each output of a DAG with a `freshness_slo` older than it, or
without a new version by its `published_by` deadline, is a `freshness_miss` occurrence for the
alert rules (one per newest event it is stale since, one per missed deadline), fenced by the
leader's epoch; with no outbox sink configured there is nothing to alert and nothing is read."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection

from treadle.domain.alerts import AlertKind, Occurrence
from treadle.domain.dag_version import DagStructure
from treadle.domain.freshness import Miss, Output, misses
from treadle.engine.alerts import raise_alerts
from treadle.engine.scheduling import LEADER_LEASE
from treadle.errors import NotLeader
from treadle.store import datasets as dataset_store
from treadle.store import freshness as freshness_store
from treadle.store import leases
from treadle.store.database import Database, db_now


def miss_payload(miss: Miss, structure: DagStructure, *, at: str, last_event_at: str) -> dict[str, Any]:
    """The alert of one miss, with what the DAG's contract says about it."""
    contract = structure.contract
    return {
        "severity": "warning",
        "dag_id": miss.dag_id,
        "dataset": miss.dataset,
        "slo_s": miss.slo_s,
        "published_by": _published_by(structure, miss) if miss.deadline_at is not None else None,
        "deadline_at": miss.deadline_at,
        "age_s": round(miss.age_s, 3),
        "last_event_at": last_event_at,
        "owner": structure.owner,
        "impact": contract.failure_impact,
        "runbook_url": contract.runbook_url,
        "at": at,
        "next_action": _NEXT_ACTION.format(dag=miss.dag_id),
    }


_NEXT_ACTION = (
    "look at the latest runs of {dag} (`treadle runs list --dag {dag}`); "
    "`treadle datasets freshness` shows every output's age"
)


def _occurrence(miss: Miss, structure: DagStructure, *, at: str, last_event_at: str) -> Occurrence:
    if miss.deadline_at is not None:
        summary = f"{miss.dataset} (of {miss.dag_id}) had no new version by {structure.contract.published_by}"
    else:
        summary = f"{miss.dataset} (of {miss.dag_id}) is {miss.age_s / 3600:.1f} h old, past its SLO"
    return Occurrence(
        kind=AlertKind.FRESHNESS_MISS,
        key=f"freshness\0{miss.key}",
        dag_id=miss.dag_id,
        subject_detail=miss.dataset,
        summary=summary,
        next_action=_NEXT_ACTION.format(dag=miss.dag_id),
        facts=miss_payload(miss, structure, at=at, last_event_at=last_event_at),
    )


def check_freshness(db: Database, *, holder: str, epoch: int) -> int:
    """Alert every output that newly missed its SLO; returns how many alerts were written."""
    if not db.outbox_sinks:
        return 0

    def work(conn: Connection) -> int:
        now = db_now(conn)
        if not leases.hold(conn, LEADER_LEASE, holder=holder, epoch=epoch, now=now):
            raise NotLeader(holder=holder, epoch=epoch)
        structures = {
            s.dag_id: s for s in dataset_store.latest_structures(conn) if s.contract.has_freshness_slo
        }
        wanted = [(s, name) for s in structures.values() for name in s.outputs()]
        newest = dataset_store.last_event_times(conn, [name for _, name in wanted])
        outputs = []
        for s, name in wanted:
            slo_s, deadline = s.contract.slos_of(name)
            if slo_s is None and deadline is None:
                continue
            outputs.append(
                Output(
                    dag_id=s.dag_id,
                    dataset=name,
                    slo_s=slo_s,
                    last_event_at=newest.get(name),
                    deadline=deadline,
                )
            )
        found = [
            _occurrence(m, structures[m.dag_id], at=now.isoformat(), last_event_at=_last(m, newest))
            for m in misses(outputs, now=now)
            if freshness_store.record_miss(conn, m, now=now)
        ]
        raise_alerts(db, conn, found, structure_of=lambda o: structures.get(o.dag_id), now=now)
        return len(found)

    found: int = db.transact(work)
    return found


def _last(miss: Miss, newest: dict[str, datetime]) -> str:
    last = newest.get(miss.dataset)
    return "" if last is None else last.isoformat()


def _published_by(structure: DagStructure, miss: Miss) -> str:
    deadline = structure.contract.slos_of(miss.dataset)[1]
    return "" if deadline is None else str(deadline)
