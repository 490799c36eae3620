"""The leader's freshness check: each output of a DAG with a `freshness_slo` older than it gets
one `freshness.miss` alert in the outbox (per newest event it is stale since), fenced by the
leader's epoch; with no outbox sink configured there is nothing to alert and nothing is read."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Connection

from treadle.domain.dag_version import DagStructure
from treadle.domain.freshness import Miss, Output, misses
from treadle.domain.outbox import OutboxKind
from treadle.engine import outbox
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
        "age_s": round(miss.age_s, 3),
        "last_event_at": last_event_at,
        "owner": structure.owner,
        "impact": contract.failure_impact,
        "runbook_url": contract.runbook_url,
        "at": at,
        "next_action": (
            f"look at the latest runs of {miss.dag_id} (`treadle runs list --dag {miss.dag_id}`); "
            "`treadle datasets freshness` shows every output's age"
        ),
    }


def check_freshness(db: Database, *, holder: str, epoch: int) -> int:
    """Alert every output that newly missed its SLO; returns how many alerts were written."""
    if not db.outbox_sinks:
        return 0

    def work(conn: Connection) -> int:
        now = db_now(conn)
        if not leases.hold(conn, LEADER_LEASE, holder=holder, epoch=epoch, now=now):
            raise NotLeader(holder=holder, epoch=epoch)
        structures = {
            s.dag_id: s
            for s in dataset_store.latest_structures(conn)
            if s.contract.freshness_slo_s is not None
        }
        wanted = [(s, name) for s in structures.values() for name in s.outputs()]
        newest = dataset_store.last_event_times(conn, [name for _, name in wanted])
        outputs = [
            Output(
                dag_id=s.dag_id,
                dataset=name,
                slo_s=s.contract.freshness_slo_s or 0.0,
                last_event_at=newest.get(name),
            )
            for s, name in wanted
        ]
        payloads = [
            miss_payload(m, structures[m.dag_id], at=now.isoformat(), last_event_at=m.period)
            for m in misses(outputs, now=now)
            if freshness_store.record_miss(conn, m, now=now)
        ]
        outbox.enqueue(db, conn, kind=OutboxKind.FRESHNESS_MISS, payloads=payloads)
        return len(payloads)

    found: int = db.transact(work)
    return found
