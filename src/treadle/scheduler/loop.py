"""The scheduler loop: lead or stand by; the leader fires schedules and applies deadlines.

No user code here: schedules, params schemas and structures are read from the database.
Several schedulers may run; one leads (engine/leadership.py), the others poll the lease a
few times a second and take over when it lapses.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from datetime import timedelta

from treadle.domain.admission import NO_LIMITS, AdmissionLimits
from treadle.domain.durations import DEFAULT_TASK_TIMEOUT_S
from treadle.engine.alerts import check_alerts
from treadle.engine.backfill_drain import drain_backfills
from treadle.engine.datasets import trigger_dataset_runs
from treadle.engine.freshness import check_freshness
from treadle.engine.leadership import Leadership
from treadle.engine.reaper import (
    enforce_execution_deadlines,
    expire_dispatch_deadlines,
    promote_due_retries,
    reap_expired_leases,
)
from treadle.engine.retention import PruneReport, prune
from treadle.engine.runs import finish_idle_runs
from treadle.engine.scheduling import (
    FireReport,
    fire_due_schedules,
    next_wakeup,
    prefetch_versions,
)
from treadle.errors import NotLeader
from treadle.observability.hooks import NO_HOOKS, Hooks
from treadle.store import activity
from treadle.store.database import Database
from treadle.store.dialects import READY_CHANNEL, SCHEDULER_CHANNEL
from treadle.store.notifications import listen

log = logging.getLogger("treadle.scheduler")

#: Seconds between two retention batches: pruning is housekeeping, not per-tick work.
RETENTION_INTERVAL_S = 60.0
#: Schedules fired per transaction; a full batch is followed by another at once.
FIRE_BATCH = 500
#: Firing passes run side by side during a burst (each on its own schedules).
FIRE_PARALLEL = 2
#: While idle, the leader reads the DAG versions of schedules due this soon (seconds) ...
PREFETCH_AHEAD_S = 10.0
#: ... when the next fire is at least this far away (seconds).
PREFETCH_MIN_IDLE_S = 0.2
#: Seconds between two attempts of a standby to take the leader lease.
STANDBY_POLL_S = 0.5
#: A step that took longer than this share of the worker lease counts as a database stall.
STALL_SHARE = 0.5
#: A leader's lease is kept alive from a thread of its own while one step runs long (a burst of
#: due schedules, a large reap), but not past this many leases: a step stuck that long (a hung
#: connection) lets the lease lapse, so a standby takes over and fencing refuses the old one.
KEEP_LEASE_FOR_LEASES = 10
#: Longest wait between two maintenance passes of a leader with nothing in flight, where
#: wake-ups reach it (a trigger, a clear, a requeue or a new backfill wakes it at once).
IDLE_TICK_S = 30.0


class Scheduler:
    """Leads (fires due schedules, moves due retries, reaps leases, closes runs) or stands by."""

    def __init__(
        self,
        db: Database,
        *,
        tick_s: float,
        retention_days: float = 0.0,
        audit_retention_days: float = 0.0,
        lease_s: float = 30.0,
        leader_lease_s: float = 3.0,
        default_queue_timeout_s: float = 600.0,
        max_skew_s: float = 2.0,
        holder: str | None = None,
        on_pruned: Callable[[list[str]], object] | None = None,
        default_task_timeout_s: float | None = DEFAULT_TASK_TIMEOUT_S,
        admission: AdmissionLimits = NO_LIMITS,
        hooks: Hooks = NO_HOOKS,
    ) -> None:
        self.db = db
        #: Limits on queued task instances a dataset or backfill run must fit in (else it waits).
        self.admission = admission
        #: Told of fire delays and reaped leases (metrics); no-ops unless a process sets them.
        self.hooks = hooks
        #: Deletes the files of runs that retention pruned (given by the process that knows where).
        self.on_pruned = on_pruned
        self.tick_s = tick_s
        #: A worker silent this long is not live; an unenforced deadline this old is the reaper's.
        self.lease_s = lease_s
        #: Finished history older than this many days is pruned; 0 keeps everything.
        self.retention_days = retention_days
        #: Audit entries older than this many days are pruned; 0 keeps the whole audit log.
        self.audit_retention_days = audit_retention_days
        self.default_queue_timeout_s = default_queue_timeout_s
        #: Timeout of the task instances it creates whose task sets none (None: no timeout).
        self.default_task_timeout_s = default_task_timeout_s
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.leadership = Leadership(db, holder=self.holder, lease_s=leader_lease_s, max_skew_s=max_skew_s)
        #: Monotonic time of the next retention batch; 0 makes the first pass prune.
        self.next_prune_at = 0.0
        #: Monotonic times of the next lease refresh and the next maintenance tick.
        self.next_lease_at = 0.0
        self.next_tick_at = 0.0
        #: Monotonic time since which the database has answered steadily. Deadlines measured in
        #: database time (leases above all) ran on while nobody could renew them, so after an
        #: outage or a stall they are applied only once workers had one lease to renew.
        self.reachable_since = float("-inf")
        #: Monotonic start of the loop's current step (a stall inside it holds deadlines at once).
        self.step_began = float("inf")
        #: The same while a step runs, infinity between steps (read by the lease keeper).
        self.in_step_since = float("inf")
        self.stopping = threading.Event()
        #: Set by a wake-up (work was triggered, cleared, requeued; a backfill created): an idle
        #: leader goes back to a maintenance pass every `tick_s`.
        self.wake = threading.Event()
        #: Whether the last maintenance pass found nothing in flight (then it waits for a
        #: wake-up, IDLE_TICK_S at most, instead of ticking every `tick_s`).
        self.idle = False
        #: Set by run(): whether wake-ups reach this process (else it ticks every `tick_s`).
        self.wakeups = False
        #: When the next freshness check is due (monotonic).
        self.next_freshness_at = 0.0
        self.fire_pool = ThreadPoolExecutor(max_workers=FIRE_PARALLEL, thread_name_prefix="treadle-fire")
        #: Held by every lease refresh: the loop's own and the keeper's (`_keep_lease`).
        self.lease_lock = threading.Lock()

    def tick(self) -> dict[str, int]:
        """Run one maintenance pass (deadlines, retries, runs); returns what it changed."""
        changes = {"retries_queued": promote_due_retries(self.db)}
        if self._deadlines_trusted():
            changes["leases_reaped"] = reap_expired_leases(
                self.db, evidence_within_s=self.lease_s * STALL_SHARE
            )
            if self._deadlines_trusted():
                changes["deadlines_enforced"] = enforce_execution_deadlines(self.db, grace_s=self.lease_s)
                changes["dispatch_timeouts"] = expire_dispatch_deadlines(self.db, worker_stale_s=self.lease_s)
        changes["runs_finished"] = finish_idle_runs(self.db)
        self.prune_step()
        return changes

    def fire(self) -> FireReport:
        """Create the runs of every due schedule slot (batch after batch); leader only.

        After a full batch (a burst), FIRE_PARALLEL passes run side by side, each on schedules
        the others do not hold, so the database works on one batch while Python builds the next.
        """
        epoch = self.leadership.epoch
        total = FireReport()
        width = 1
        while epoch is not None and not self.stopping.is_set():
            # A long burst renews the lease between batches instead of letting it lapse.
            if time.monotonic() >= self.next_lease_at and (
                not self._refresh_lease() or self.leadership.epoch != epoch
            ):
                break
            if not self.leadership.is_leader():
                break

            def one_pass(_: int, fenced_epoch: int = epoch) -> FireReport:
                return fire_due_schedules(
                    self.db,
                    holder=self.holder,
                    epoch=fenced_epoch,
                    default_queue_timeout_s=self.default_queue_timeout_s,
                    limit=FIRE_BATCH,
                    default_task_timeout_s=self.default_task_timeout_s,
                )

            reports = [one_pass(0)] if width == 1 else list(self.fire_pool.map(one_pass, range(width)))
            for report in reports:
                self._observe_fires(report)
                total.runs_created += report.runs_created
                total.slots_skipped += report.slots_skipped
                total.blocked += report.blocked
                total.examined += report.examined
            # Slots due after the earliest pass looked are not known to be handled.
            total.now = min((r.now for r in reports if r.now is not None), default=None)
            created = sum(r.runs_created for r in reports)
            if created:
                log.info("runs created", extra={"event": "scheduler.fired", "runs": created, "epoch": epoch})
            if all(r.examined < FIRE_BATCH for r in reports) or created == 0:
                break
            width = FIRE_PARALLEL
        return total

    def _observe_fires(self, report: FireReport) -> None:
        """Tell the hooks how late each created run came after its slot's fire time (its end)."""
        if report.now is None:
            return
        for run in report.created:
            if run.data_interval_end is not None:
                delay_s = (report.now - run.data_interval_end).total_seconds()
                self.hooks.schedule_fired(delay_s=max(delay_s, 0.0))

    def trigger_datasets(self) -> dict[str, int]:
        """Create the runs of dataset-scheduled DAGs whose datasets all have new events."""
        epoch = self.leadership.epoch
        if epoch is None:
            return {}
        created = trigger_dataset_runs(
            self.db,
            holder=self.holder,
            epoch=epoch,
            default_queue_timeout_s=self.default_queue_timeout_s,
            default_task_timeout_s=self.default_task_timeout_s,
            admission=self.admission,
        )
        return {"dataset_runs": created}

    def check_freshness(self) -> dict[str, int]:
        """Alert outputs that newly missed their DAG's freshness SLO, and lasting states the alert
        rules watch (every TREADLE_ALERT_CHECK_SECONDS)."""
        epoch = self.leadership.epoch
        if epoch is None or time.monotonic() < self.next_freshness_at:
            return {}
        self.next_freshness_at = time.monotonic() + self.db.alerting.check_s
        return {
            "freshness_misses": check_freshness(self.db, holder=self.holder, epoch=epoch),
            "alerts": check_alerts(self.db, holder=self.holder, epoch=epoch),
        }

    def drain_backfills(self) -> dict[str, int]:
        """Hand running backfills their next intervals, within each backfill's budget."""
        epoch = self.leadership.epoch
        if epoch is None:
            return {}
        handled = drain_backfills(
            self.db,
            holder=self.holder,
            epoch=epoch,
            default_queue_timeout_s=self.default_queue_timeout_s,
            default_task_timeout_s=self.default_task_timeout_s,
            admission=self.admission,
        )
        return {"backfill_intervals": handled}

    def step(self) -> float:
        """One turn of the loop; returns how long to sleep before the next."""
        if time.monotonic() >= self.next_lease_at:
            self._refresh_lease()
        if not self.leadership.is_leader():
            # Whatever happened while another scheduler led: look at once on taking over.
            self.idle, self.next_tick_at = False, 0.0
            return max(0.0, self.next_lease_at - time.monotonic())
        try:
            fired = self.fire()
            if time.monotonic() >= self.next_tick_at:
                self.next_tick_at = time.monotonic() + self.tick_s
                changes: dict[str, int] = {}
                # Slots that fall due meanwhile fire between the duties, not after all of them.
                for duty in (self.trigger_datasets, self.drain_backfills, self.check_freshness, self.tick):
                    changes.update(duty())
                    fired = self.fire()
                if any(changes.values()):
                    log.info("scheduler tick", extra={"event": "scheduler.tick", **changes})
                self.idle = self.wakeups and not self.db.query(activity.in_flight)
                if self.idle:
                    self.next_tick_at = time.monotonic() + max(IDLE_TICK_S, self.tick_s)
        except NotLeader as exc:
            self.leadership.step_down(str(exc))
            self.next_lease_at = 0.0
            return 0.0
        wake = min(self.next_lease_at, self.next_tick_at) - time.monotonic()
        db_now, next_fire = next_wakeup(self.db, handled_until=fired.now)
        if next_fire is not None:
            until_fire = (next_fire - db_now).total_seconds()
            if until_fire > PREFETCH_MIN_IDLE_S:
                prefetch_versions(self.db, within_s=PREFETCH_AHEAD_S)
            wake = min(wake, until_fire)
        return max(0.0, wake)

    def _refresh_lease(self) -> bool:
        """Renew (or try to take) the leader lease and schedule the next refresh."""
        with self.lease_lock:
            leading = self.leadership.refresh()
            self.next_lease_at = time.monotonic() + (
                self.leadership.renew_every_s if leading else STANDBY_POLL_S
            )
        return leading

    def _keep_lease(self) -> None:
        """While a step of the leader runs longer than a renewal interval, renew from here.

        The loop renews between steps and between fire batches; one duty can still take longer
        than the lease under load (a large reap or drain, thousands of runs created). Only a
        lease already held is renewed (never taken), and only for KEEP_LEASE_FOR_LEASES leases
        of one step. A failed renewal is the loop's to notice: `is_leader` turns false when the
        lease's own deadline passes, and every leader write is fenced by its epoch anyway.
        """
        every = self.leadership.renew_every_s / 2
        while not self.stopping.wait(every):
            running_for = time.monotonic() - self.in_step_since
            if not (
                self.leadership.renew_every_s
                <= running_for
                <= self.leadership.lease_s * KEEP_LEASE_FOR_LEASES
            ):
                continue
            if not self.leadership.is_leader() or time.monotonic() < self.next_lease_at:
                continue
            try:
                if self._refresh_lease():
                    log.info(
                        "lease renewed during a long step",
                        extra={"event": "scheduler.lease_kept", "step_s": round(running_for, 1)},
                    )
            except Exception as exc:  # the database: the loop's own step will meet it too
                log.warning(
                    "cannot renew the leader lease during a long step",
                    extra={"event": "scheduler.lease_keep_failed", "error": str(exc)[:300]},
                )

    def prune_step(self) -> PruneReport | None:
        """Prune one batch of history older than `retention_days` (and of audit entries older than
        `audit_retention_days`) if one is due; None if not."""
        if self.retention_days <= 0 and self.audit_retention_days <= 0:
            return None
        if time.monotonic() < self.next_prune_at:
            return None
        # Set before pruning, so a failing prune is retried once an interval, not every tick.
        self.next_prune_at = time.monotonic() + RETENTION_INTERVAL_S
        report = prune(
            self.db,
            older_than=timedelta(days=self.retention_days) if self.retention_days > 0 else None,
            audit_older_than=timedelta(days=self.audit_retention_days)
            if self.audit_retention_days > 0
            else None,
            max_batches=1,
            on_deleted=self.on_pruned,
        )
        if report.deleted_anything:
            log.info(
                "retention pruned",
                extra={
                    "event": "retention.pruned",
                    "cutoff": report.cutoff.isoformat() if report.cutoff else None,
                    "audit_cutoff": report.audit_cutoff.isoformat() if report.audit_cutoff else None,
                    **asdict(report.rows),
                },
            )
        return report

    def run(self) -> None:
        """Loop until stopped; database errors back off and retry, never end the loop (F7).

        On stop the leader lease is released, so a standby takes over at once.
        """
        self.wakeups = self.db.supports_wakeups
        if self.wakeups:
            handlers = {READY_CHANNEL: self.wake.set, SCHEDULER_CHANNEL: self.wake.set}
            threading.Thread(
                target=listen,
                name="treadle-scheduler-listen",
                daemon=True,
                kwargs={"url": self.db.url, "handlers": handlers, "stop": self.stopping},
            ).start()
        threading.Thread(target=self._keep_lease, name="treadle-lease-keeper", daemon=True).start()
        failures = 0
        while not self.stopping.is_set():
            if self.wake.is_set():
                self.wake.clear()
                if self.idle:  # something may be in flight now: back to a pass every tick_s
                    self.idle = False
                    self.next_tick_at = min(self.next_tick_at, time.monotonic() + self.tick_s)
            began = self.step_began = self.in_step_since = time.monotonic()
            if failures:
                # The database failed the last step and the loop then slept out its backoff,
                # which can be longer than a lease: the server may have come back just now, so
                # it counts as answering steadily from this step on, not from that failure.
                self.reachable_since = max(self.reachable_since, began)
            try:
                delay = self.step()
                failures = 0
                if time.monotonic() - began > self.lease_s * STALL_SHARE:
                    self._database_was_unreachable("a step stalled")
            except Exception:
                failures += 1
                log.exception("scheduler step failed", extra={"event": "scheduler.step_error"})
                self._database_was_unreachable("a step failed")
                delay = min(self.tick_s * 2**failures, 30.0) * (0.5 + random.random())
            finally:
                self.in_step_since = float("inf")
            # Busy, a wake-up changes nothing (the next pass is at most `tick_s` away).
            (self.wake if self.idle else self.stopping).wait(delay)
        self.fire_pool.shutdown(wait=True)
        self.leadership.resign()

    def _deadlines_trusted(self) -> bool:
        """True once the database answered steadily for a lease, this step included: a step
        that stalled (a call waited out a frozen or restarting server) holds deadlines now,
        before it reaps on database time that ran on while no worker could renew."""
        if time.monotonic() - self.step_began > self.lease_s * STALL_SHARE:
            self._database_was_unreachable("a step stalled")
            self.step_began = float("inf")  # held once per step
        return time.monotonic() - self.reachable_since >= self.lease_s

    def _database_was_unreachable(self, why: str) -> None:
        """Hold lease and deadline enforcement for one lease from now (see `reachable_since`)."""
        self.reachable_since = time.monotonic()
        log.warning(
            "database unreachable or stalled; lease expiries and deadlines wait one lease",
            extra={"event": "scheduler.deadlines_held", "why": why, "hold_s": self.lease_s},
        )

    def stop(self) -> None:
        """Stop after the current step (and release the leader lease)."""
        self.stopping.set()
        self.wake.set()
