"""Alerts: occurrences matched against the DAG's and the deployment's rules, each rule's alert
recorded once per occurrence and written to the outbox in the same transaction, repeats about
one subject within the rule's window and backfill runs' alerts recorded but not sent.

Two sources of occurrences: changes that happen in a transaction of their own (a dead letter,
with its sensor timeout or failed quality gate, see `dead_letters`; a freshness miss) and the
leader's periodic check (`check_alerts`) for states that last: instances awaiting inspection or
retried often, runs and backfills past their budget, failed runs in a row. Nothing is read or
written when no outbox sink is configured.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.engine import Connection

from treadle.domain.alerts import (
    AlertKind,
    AlertRule,
    Context,
    Disposition,
    Occurrence,
    alert_payload,
    disposition,
    rules_for,
    rules_of_kind,
)
from treadle.domain.dag_version import DagStructure
from treadle.domain.outbox import OutboxKind
from treadle.domain.states import DeadLetterReason, RunState, RunType
from treadle.engine.outbox import write_entries
from treadle.engine.scheduling import LEADER_LEASE
from treadle.engine.versions import version_of
from treadle.errors import NotLeader
from treadle.store import alerts as alert_store
from treadle.store import datasets as dataset_store
from treadle.store import leases
from treadle.store import runs as run_store
from treadle.store.database import Database, db_now

_OUTBOX_KIND = {
    AlertKind.DEAD_LETTER: OutboxKind.TASK_DEAD_LETTER,
    AlertKind.FRESHNESS_MISS: OutboxKind.FRESHNESS_MISS,
    AlertKind.NEEDS_INSPECTION: OutboxKind.NEEDS_INSPECTION,
    AlertKind.QUALITY_GATE_FAILED: OutboxKind.QUALITY_GATE_FAILED,
    AlertKind.CONSECUTIVE_FAILURES: OutboxKind.CONSECUTIVE_FAILURES,
    AlertKind.RUN_OVER_BUDGET: OutboxKind.RUN_OVER_BUDGET,
    AlertKind.REPEATED_RETRIES: OutboxKind.REPEATED_RETRIES,
    AlertKind.SENSOR_TIMEOUT: OutboxKind.SENSOR_TIMEOUT,
    AlertKind.BACKFILL_OVER_BUDGET: OutboxKind.BACKFILL_OVER_BUDGET,
}


def _context(db: Database, structure: DagStructure | None, occurrence: Occurrence) -> Context:
    ui_url = db.alerting.ui_url(
        dag_id=occurrence.dag_id,
        run_id=occurrence.run_id,
        task_id=occurrence.task_id,
        map_index=occurrence.map_index,
    )
    if structure is None:
        return Context(ui_url=ui_url)
    contract = structure.contract
    return Context(
        owner=structure.owner,
        impact=contract.failure_impact,
        criticality=None if contract.criticality is None else contract.criticality.value,
        runbook_url=contract.runbook_url,
        ui_url=ui_url,
    )


def raise_alerts(
    db: Database,
    conn: Connection,
    occurrences: Sequence[Occurrence],
    *,
    structure_of: Callable[[Occurrence], DagStructure | None],
    now: datetime,
) -> int:
    """Apply the rules to `occurrences` in the caller's transaction; returns the alerts sent."""
    if not db.outbox_sinks or not occurrences:
        return 0
    sent = 0
    for occurrence in occurrences:
        structure = structure_of(occurrence)
        dag_rules = structure.contract.alerts if structure is not None else ()
        matched = rules_for(
            occurrence, dag_rules=dag_rules, system_rules=db.alerting.rules, dag_id=occurrence.dag_id
        )
        keys = {rule_id: _key(rule_id, occurrence) for rule_id, _ in matched}
        done = alert_store.fired_keys(conn, keys.values())
        for rule_id, rule in matched:
            if keys[rule_id] in done:
                continue
            outcome = _fire(
                conn, rule_id, rule, occurrence, key=keys[rule_id], now=now, dedup_s=db.alerting.dedup_s
            )
            if outcome is not Disposition.SENT:
                continue
            payload = alert_payload(rule_id, rule, occurrence, _context(db, structure, occurrence), at=now)
            write_entries(db, conn, kind=_OUTBOX_KIND[occurrence.kind], payloads=[payload])
            sent += 1
    return sent


def _key(rule_id: str, occurrence: Occurrence) -> str:
    return hashlib.sha256(f"{rule_id}\0{occurrence.key}".encode()).hexdigest()


def _fire(
    conn: Connection,
    rule_id: str,
    rule: AlertRule,
    occurrence: Occurrence,
    *,
    key: str,
    now: datetime,
    dedup_s: float,
) -> Disposition:
    last = alert_store.last_sent_at(conn, rule=rule_id, subject=occurrence.subject)
    outcome = disposition(rule, occurrence, last_sent_at=last, now=now, default_dedup_s=dedup_s)
    alert_store.record(
        conn,
        alert_store.Firing(
            key=key,
            rule=rule_id,
            subject=occurrence.subject,
            kind=occurrence.kind.value,
            dag_id=occurrence.dag_id,
            run_id=occurrence.run_id,
            disposition=outcome.value,
            fired_at=now,
        ),
    )
    return outcome


def dead_letters(db: Database, conn: Connection, payloads: Sequence[dict[str, Any]]) -> int:
    """Alerts of task instances that just became dead letters (engine/outbox.dead_letter_payload
    made `payloads`), in the transaction that dead-lettered them: the dead letter itself and,
    when it is one, the sensor timeout or the failed quality gate."""
    if not db.outbox_sinks:
        return 0
    found: list[Occurrence] = []
    structures: dict[str, DagStructure | None] = {}
    for p in payloads:
        run = run_store.get_run(conn, p["run_id"])
        structures[p["run_id"]] = None if run is None else version_of(db, conn, run.dag_version_id).structure
        found.extend(
            _dead_letter_occurrences(p, is_backfill=run is not None and run.run_type == RunType.BACKFILL)
        )
    return raise_alerts(
        db, conn, found, structure_of=lambda o: structures.get(o.run_id or ""), now=db_now(conn)
    )


def _dead_letter_occurrences(p: dict[str, Any], *, is_backfill: bool) -> list[Occurrence]:
    task = p["task_id"] if p.get("map_index", -1) < 0 else f"{p['task_id']}[{p['map_index']}]"
    where = f"{p['dag_id']}.{task} in run {p['run_id']}"
    common: dict[str, Any] = {
        "dag_id": p["dag_id"],
        "task_id": p["task_id"],
        "run_id": p["run_id"],
        "map_index": p.get("map_index", -1),
        "is_backfill": is_backfill,
        "facts": dict(p),
    }
    ident = f"{p['run_id']}\0{p['task_id']}\0{p.get('map_index', -1)}\0{p.get('attempt')}"
    found = [
        Occurrence(
            kind=AlertKind.DEAD_LETTER,
            key=f"dead_letter\0{ident}",
            summary=f"{where} is a dead letter ({p.get('reason') or 'failed'}): {p.get('error_type')}",
            next_action=p.get("next_action") or "",
            **common,
        )
    ]
    if p.get("reason") == DeadLetterReason.SENSOR_TIMEOUT.value:
        found.append(
            Occurrence(
                kind=AlertKind.SENSOR_TIMEOUT,
                key=f"sensor_timeout\0{ident}",
                summary=f"sensor {where} timed out: its source is unavailable",
                next_action=(
                    "check the source the sensor waits for; once it is there, "
                    f"`treadle dead-letters requeue {p['run_id']} {p['task_id']}`"
                ),
                **common,
            )
        )
    quality = p.get("quality")
    if isinstance(quality, dict) and quality.get("state") == "failed":
        failed = [
            c.get("name") for c in quality.get("checks", []) if isinstance(c, dict) and not c.get("passed")
        ]
        found.append(
            Occurrence(
                kind=AlertKind.QUALITY_GATE_FAILED,
                key=f"quality_gate_failed\0{ident}",
                summary=f"quality gate {where} failed: {', '.join(map(str, failed)) or 'a blocker check'}",
                next_action=(
                    "look at the failed checks (`treadle runs show "
                    f"{p['run_id']}`); fix the data upstream, then rerun the run"
                ),
                **common,
            )
        )
    return found


def check_alerts(db: Database, *, holder: str, epoch: int) -> int:
    """The leader's check of lasting states against the rules; returns the alerts sent."""
    if not db.outbox_sinks:
        return 0

    def work(conn: Connection) -> int:
        now = db_now(conn)
        if not leases.hold(conn, LEADER_LEASE, holder=holder, epoch=epoch, now=now):
            raise NotLeader(holder=holder, epoch=epoch)
        structures = {s.dag_id: s for s in dataset_store.latest_structures(conn)}
        found = _lasting_occurrences(db, conn, structures, now=now)
        return raise_alerts(db, conn, found, structure_of=lambda o: structures.get(o.dag_id), now=now)

    sent: int = db.transact(work)
    return sent


def _applicable(
    db: Database, structures: Mapping[str, DagStructure], kind: AlertKind
) -> dict[str, list[AlertRule]]:
    """The rules of `kind` per DAG (only DAGs that have some)."""
    found = {}
    for dag_id, s in structures.items():
        rules = rules_of_kind(kind, dag_rules=s.contract.alerts, system_rules=db.alerting.rules)
        if rules:
            found[dag_id] = rules
    return found


def _lasting_occurrences(
    db: Database, conn: Connection, structures: Mapping[str, DagStructure], *, now: datetime
) -> list[Occurrence]:
    found: list[Occurrence] = []
    found += _inspections(conn, _applicable(db, structures, AlertKind.NEEDS_INSPECTION))
    found += _retries(conn, _applicable(db, structures, AlertKind.REPEATED_RETRIES))
    found += _long_runs(conn, _applicable(db, structures, AlertKind.RUN_OVER_BUDGET), now=now)
    found += _streaks(conn, _applicable(db, structures, AlertKind.CONSECUTIVE_FAILURES))
    found += _long_backfills(conn, _applicable(db, structures, AlertKind.BACKFILL_OVER_BUDGET), now=now)
    return found


def _task_name(row: alert_store.InstanceRow) -> str:
    return row.task_id if row.map_index < 0 else f"{row.task_id}[{row.map_index}]"


def _inspections(conn: Connection, rules: Mapping[str, list[AlertRule]]) -> list[Occurrence]:
    if not rules:
        return []
    return [
        Occurrence(
            kind=AlertKind.NEEDS_INSPECTION,
            key=f"needs_inspection\0{r.run_id}\0{r.task_id}\0{r.map_index}\0{r.attempt}",
            dag_id=r.dag_id,
            task_id=r.task_id,
            run_id=r.run_id,
            map_index=r.map_index,
            is_backfill=r.run_type == RunType.BACKFILL,
            summary=(
                f"{r.dag_id}.{_task_name(r)} in run {r.run_id} needs inspection: "
                "it may have committed its work before it failed"
            ),
            next_action=(
                "check whether its effect happened, then `treadle tasks resolve "
                f"{r.run_id} {r.task_id} --as success|failed|requeue --reason ...`"
            ),
            facts={"attempt": r.attempt},
        )
        for r in alert_store.awaiting_inspection(conn, sorted(rules))
    ]


def _retries(conn: Connection, rules: Mapping[str, list[AlertRule]]) -> list[Occurrence]:
    if not rules:
        return []
    least = min(r.count or 1 for group in rules.values() for r in group)
    found = []
    for r in alert_store.retried(conn, at_least=least, dag_ids=sorted(rules)):
        retries = r.attempt - r.budget_base - (0 if r.state == "retry_wait" else 1)
        found.append(
            Occurrence(
                kind=AlertKind.REPEATED_RETRIES,
                key=f"repeated_retries\0{r.run_id}\0{r.task_id}\0{r.map_index}\0{r.budget_base}",
                dag_id=r.dag_id,
                task_id=r.task_id,
                run_id=r.run_id,
                map_index=r.map_index,
                is_backfill=r.run_type == RunType.BACKFILL,
                measure=retries,
                summary=f"{r.dag_id}.{_task_name(r)} in run {r.run_id} was retried {retries} times",
                next_action=(
                    f"read its attempts' errors (`treadle runs show {r.run_id}`, `treadle logs "
                    f"{r.run_id} {r.task_id}`); a failure that repeats is rarely transient"
                ),
                facts={"retries": retries, "attempt": r.attempt},
            )
        )
    return found


def _long_runs(conn: Connection, rules: Mapping[str, list[AlertRule]], *, now: datetime) -> list[Occurrence]:
    if not rules:
        return []
    shortest = min(r.budget_s or 0.0 for group in rules.values() for r in group)
    found = []
    for run in alert_store.running_since_before(
        conn, before=now - timedelta(seconds=shortest), dag_ids=sorted(rules)
    ):
        assert run.started_at is not None
        took = (now - run.started_at).total_seconds()
        found.append(
            Occurrence(
                kind=AlertKind.RUN_OVER_BUDGET,
                key=f"run_over_budget\0{run.run_id}",
                dag_id=run.dag_id,
                run_id=run.run_id,
                is_backfill=run.run_type == RunType.BACKFILL,
                measure=took,
                summary=f"run {run.run_id} of {run.dag_id} has been running for {took / 60:.0f} min",
                next_action=(
                    f"`treadle why {run.run_id}` shows what it waits for; "
                    f"`treadle runs cancel {run.run_id}` ends it"
                ),
                facts={"running_s": round(took, 3), "started_at": run.started_at.isoformat()},
            )
        )
    return found


def _streaks(conn: Connection, rules: Mapping[str, list[AlertRule]]) -> list[Occurrence]:
    """A DAG's failed runs in a row, from its newest `count` ended runs (the largest count of its
    rules): enough to decide every rule, and one short indexed read per DAG. The streak's first
    run (its key) is the oldest failed run read, so a streak is one occurrence until it grows past
    that count; a longer one slides with each new failure, its repeats recorded as duplicates
    within the rule's window and sent again once per window while the DAG keeps failing."""
    found = []
    for dag_id in sorted(rules):
        needed = max(r.count or 1 for r in rules[dag_id])
        latest = alert_store.latest_ended(conn, dag_id, limit=needed)
        streak = []
        for run in latest:
            if run.state != RunState.FAILED.value:
                break
            streak.append(run)
        if not streak:
            continue
        first, newest = streak[-1], streak[0]
        many = f"at least {len(streak)}" if len(streak) == needed else str(len(streak))
        found.append(
            Occurrence(
                kind=AlertKind.CONSECUTIVE_FAILURES,
                key=f"consecutive_failures\0{first.run_id}",
                dag_id=dag_id,
                run_id=newest.run_id,
                measure=len(streak),
                summary=f"{dag_id} failed {many} runs in a row (latest {newest.run_id})",
                next_action=(
                    f"`treadle runs list --dag {dag_id}` and `treadle why {newest.run_id}`; "
                    "the same failure in every run points at a change, not at chance"
                ),
                facts={"failed_runs": len(streak), "first_failed_run_id": first.run_id},
            )
        )
    return found


def _long_backfills(
    conn: Connection, rules: Mapping[str, list[AlertRule]], *, now: datetime
) -> list[Occurrence]:
    if not rules:
        return []
    shortest = min(r.budget_s or 0.0 for group in rules.values() for r in group)
    found = []
    for b in alert_store.running_backfills(conn, created_before=now - timedelta(seconds=shortest)):
        if b.dag_id not in rules:
            continue
        took = (now - b.created_at).total_seconds()
        found.append(
            Occurrence(
                kind=AlertKind.BACKFILL_OVER_BUDGET,
                key=f"backfill_over_budget\0{b.id}",
                dag_id=b.dag_id,
                subject_detail=f"backfill {b.id}",
                measure=took,
                summary=(
                    f"backfill {b.id} of {b.dag_id} has taken {took / 60:.0f} min "
                    f"and handled {b.handled} of {b.total} intervals"
                ),
                next_action=(
                    f"`treadle backfills show {b.id}`; pause it (`treadle backfills pause {b.id}`) "
                    "if it competes with scheduled runs"
                ),
                facts={
                    "backfill_id": b.id,
                    "handled": b.handled,
                    "total": b.total,
                    "running_s": round(took, 3),
                },
            )
        )
    return found
