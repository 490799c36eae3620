"""SQLAlchemy Core metadata: every table, with named constraints (migrations mirror this)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeEngine

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "pk": "pk_%(table_name)s",
}
metadata = sa.MetaData(naming_convention=NAMING)


class UTCDateTime(sa.TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every dialect (SQLite stores naive UTC text)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        # MySQL's DATETIME keeps whole seconds unless asked for microseconds; it stores no
        # zone, so values are naive UTC there as on SQLite (TIMESTAMP would stop at 2038).
        if dialect.name == "mysql":
            from sqlalchemy.dialects import mysql

            return dialect.type_descriptor(mysql.DATETIME(fsp=6))
        return dialect.type_descriptor(self.impl)

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name in ("sqlite", "mysql") else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        parsed: datetime = datetime.fromisoformat(value) if isinstance(value, str) else value
        return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


class JSONDocument(sa.TypeDecorator[Any]):
    """JSON on every dialect, stored as JSONB on PostgreSQL.

    A decorator rather than `JSON().with_variant(JSONB(), "postgresql")`: the variant needs the
    PostgreSQL dialect package at import, and a command on SQLite should not load it.
    """

    impl = sa.JSON()
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import JSONB

            return dialect.type_descriptor(JSONB())
        return dialect.type_descriptor(self.impl)


JSONType = JSONDocument()
ID = sa.String(250)
#: Seconds as a double: MySQL's plain FLOAT is single precision (0.1 would read 0.100000001).
Seconds = sa.Float().with_variant(sa.Double(asdecimal=False), "mysql")
#: MySQL tables compare text case- and accent-sensitively, as SQLite and PostgreSQL do: with
#: the server's default *_ci collation, dag ids `ETL` and `etl` would be one key.
MYSQL_OPTIONS: dict[str, Any] = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}
#: The `info` key under which a table or index keeps options only one dialect's DDL reads,
#: as {dialect: {option: value}}. SQLAlchemy loads a dialect's package to check options named
#: after it (`mysql_charset`, `postgresql_where`), so they are attached only when a database of
#: that dialect is opened (`bind_dialect`), not at import.
DIALECT_OPTIONS = "treadle_dialect_options"


def _mysql_text() -> dict[str, Any]:
    """A table's `info` giving it MYSQL_OPTIONS on MySQL."""
    return {DIALECT_OPTIONS: {"mysql": {k.removeprefix("mysql_"): v for k, v in MYSQL_OPTIONS.items()}}}


dags = sa.Table(
    "dags",
    metadata,
    sa.Column("dag_id", ID, primary_key=True),
    sa.Column("owner", sa.String(250), nullable=False),
    sa.Column("description", sa.Text, nullable=False, server_default=""),
    sa.Column("tags", JSONType, nullable=False),
    sa.Column("fileloc", sa.Text, nullable=False, server_default=""),
    sa.Column("is_paused", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("is_active", sa.Boolean, nullable=False, server_default=sa.true()),
    sa.Column("latest_version_id", sa.Integer, nullable=True),
    #: Most task instances of this DAG running at once, across its runs (None: no limit).
    sa.Column("max_active_tasks", sa.Integer, nullable=True),
    sa.Column("updated_at", UTCDateTime, nullable=False),
    #: The team that owns the DAG (`@dag(team=...)`): roles are granted per team.
    sa.Column("team", ID, nullable=False, server_default="default"),
    sa.Index(None, "team"),
    info=_mysql_text(),
)

dag_versions = sa.Table(
    "dag_versions",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("dag_id", ID, nullable=False),
    sa.Column("version_hash", sa.String(64), nullable=False),
    sa.Column("structure", JSONType, nullable=False),
    sa.Column("created_at", UTCDateTime, nullable=False),
    sa.UniqueConstraint("dag_id", "version_hash"),
    info=_mysql_text(),
)

dag_load_errors = sa.Table(
    "dag_load_errors",
    metadata,
    # 768 characters on MySQL: a utf8mb4 key may hold 3072 bytes (4 per character).
    sa.Column("fileloc", sa.String(1000).with_variant(sa.String(768), "mysql"), primary_key=True),
    sa.Column("message", sa.Text, nullable=False),
    sa.Column("traceback", sa.Text, nullable=False),
    sa.Column("recorded_at", UTCDateTime, nullable=False),
    info=_mysql_text(),
)

dag_runs = sa.Table(
    "dag_runs",
    metadata,
    sa.Column("run_id", ID, primary_key=True),
    sa.Column("dag_id", ID, nullable=False),
    sa.Column("dag_version_id", sa.Integer, nullable=False),
    sa.Column("run_type", sa.String(20), nullable=False),
    sa.Column("logical_date", UTCDateTime, nullable=False),
    sa.Column("state", sa.String(20), nullable=False),
    sa.Column("conf", JSONType, nullable=False),
    sa.Column("triggered_by", sa.String(250), nullable=False),
    sa.Column("created_at", UTCDateTime, nullable=False),
    sa.Column("started_at", UTCDateTime, nullable=True),
    sa.Column("ended_at", UTCDateTime, nullable=True),
    #: The data the run covers: [start, end). A scheduled run fires at its end.
    sa.Column("data_interval_start", UTCDateTime, nullable=True),
    sa.Column("data_interval_end", UTCDateTime, nullable=True),
    #: The conf validated against the DAG's params schema, defaults applied.
    sa.Column("params", JSONType, nullable=True),
    #: What the run is (ids, version, interval, params, who asked): given to every task.
    sa.Column("manifest", JSONType, nullable=True),
    #: normal, or shadow (a backfill that records no dataset events).
    sa.Column("mode", sa.String(20), nullable=False, server_default="normal"),
    sa.Column("backfill_id", sa.Integer, nullable=True),
    #: Epoch of the scheduler leadership that created the run (time-based runs).
    sa.Column("leader_epoch", sa.Integer, nullable=True),
    # A time-based trigger can never create two runs of one DAG for one logical date.
    sa.UniqueConstraint("dag_id", "logical_date", "run_type"),
    sa.Index(None, "dag_id", "state"),
    sa.Index(None, "backfill_id", "state"),
    # Listings stay indexed with years of history: newest runs overall, per DAG, per state.
    sa.Index(None, "state", "created_at"),
    sa.Index(None, "dag_id", "created_at"),
    sa.Index(None, "created_at"),
    sa.Index(None, "ended_at"),
    info=_mysql_text(),
)

task_instances = sa.Table(
    "task_instances",
    metadata,
    sa.Column(
        "id",
        sa.BigInteger().with_variant(sa.Integer, "sqlite"),
        primary_key=True,
        autoincrement=True,
    ),
    sa.Column("run_id", ID, nullable=False),
    sa.Column("dag_id", ID, nullable=False),
    sa.Column("task_id", ID, nullable=False),
    sa.Column("map_index", sa.Integer, nullable=False, server_default="-1"),
    sa.Column("state", sa.String(20), nullable=False),
    #: Number of the current (or last) attempt; doubles as the fencing token.
    sa.Column("attempt", sa.Integer, nullable=False, server_default="0"),
    #: Attempt number at which the retry budget was last reset (requeue of a dead letter).
    sa.Column("budget_base", sa.Integer, nullable=False, server_default="0"),
    sa.Column("orphaned_count", sa.Integer, nullable=False, server_default="0"),
    sa.Column("queue", sa.String(250), nullable=False, server_default="default"),
    sa.Column("priority_weight", sa.Integer, nullable=False, server_default="1"),
    sa.Column("pool", sa.String(250), nullable=True),
    sa.Column("pool_slots", sa.Integer, nullable=False, server_default="1"),
    #: How long the instance may stay queued before its attempt ends `dispatch_timeout`.
    sa.Column("queue_timeout_s", Seconds, nullable=True),
    sa.Column("dispatch_deadline", UTCDateTime, nullable=True),
    sa.Column("upstream_total", sa.Integer, nullable=False, server_default="0"),
    sa.Column("upstream_done", sa.Integer, nullable=False, server_default="0"),
    #: Upstream ends that failed or were skipped (trigger rules; `upstream_done` counts successes).
    sa.Column("upstream_failures", sa.Integer, nullable=False, server_default="0"),
    sa.Column("upstream_skips", sa.Integer, nullable=False, server_default="0"),
    sa.Column("queued_at", UTCDateTime, nullable=True),
    sa.Column("next_attempt_at", UTCDateTime, nullable=True),
    sa.Column("started_at", UTCDateTime, nullable=True),
    sa.Column("ended_at", UTCDateTime, nullable=True),
    sa.Column("worker_id", sa.String(250), nullable=True),
    sa.Column("hostname", sa.String(250), nullable=True),
    sa.Column("lease_expires_at", UTCDateTime, nullable=True),
    #: Database time of the attempt's claim or last lease renewal (loss versus timeout).
    sa.Column("heartbeat_at", UTCDateTime, nullable=True),
    sa.Column("timeout_s", Seconds, nullable=True),
    sa.Column("timeout_at", UTCDateTime, nullable=True),
    sa.Column("dead_letter_reason", sa.String(40), nullable=True),
    #: Sensors and submit-then-poll tasks: database time of the first poke (their timeout counts
    #: from it) and what the last poke left for the next: a submitted job's handle, or a
    #: sensor's state (0009).
    sa.Column("first_poke_at", UTCDateTime, nullable=True),
    sa.Column("poll_handle", JSONType, nullable=True),
    sa.UniqueConstraint("run_id", "task_id", "map_index"),
    sa.Index(None, "state", "next_attempt_at"),
    sa.Index(None, "state", "lease_expires_at"),
    sa.Index(None, "run_id", "state"),
    sa.Index(None, "pool", "state"),
    sa.Index(None, "dag_id", "state"),
    sa.Index(None, "state", "dispatch_deadline"),
    sa.Index(None, "state", "timeout_at"),
    info=_mysql_text(),
)

#: The claim reads queued rows in claim order and stops at its limit: an index in exactly that
#: order (partial where the dialect allows: queued rows only, so it stays as small as the queue
#: and rows leaving the queue add no entry), so a claim costs the same whatever the run size.
sa.Index(
    "ix_task_instances_claim_order",
    task_instances.c.state,
    task_instances.c.queue,
    task_instances.c.priority_weight.desc(),
    task_instances.c.queued_at,
    task_instances.c.id,
    info={
        DIALECT_OPTIONS: {
            "postgresql": {"where": task_instances.c.state == "queued"},
            "sqlite": {"where": task_instances.c.state == "queued"},
        }
    },
)

task_attempts = sa.Table(
    "task_attempts",
    metadata,
    sa.Column(
        "id",
        sa.BigInteger().with_variant(sa.Integer, "sqlite"),
        primary_key=True,
        autoincrement=True,
    ),
    sa.Column("task_instance_id", sa.BigInteger, nullable=False),
    sa.Column("run_id", ID, nullable=False),
    sa.Column("dag_id", ID, nullable=False),
    sa.Column("task_id", ID, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("outcome", sa.String(20), nullable=False),
    sa.Column("error_type", sa.String(250), nullable=True),
    sa.Column("error_message", sa.Text, nullable=True),
    sa.Column("traceback", sa.Text, nullable=True),
    sa.Column("fingerprint", sa.String(40), nullable=True),
    sa.Column("worker_id", sa.String(250), nullable=True),
    sa.Column("hostname", sa.String(250), nullable=True),
    sa.Column("started_at", UTCDateTime, nullable=True),
    sa.Column("ended_at", UTCDateTime, nullable=False),
    sa.Column("duration_s", Seconds, nullable=True),
    #: Delay chosen before the next attempt when this one was retried.
    sa.Column("retry_delay_s", Seconds, nullable=True),
    #: Set when a worker that had lost this attempt reported it anyway (discarded, not applied).
    sa.Column("late_result", sa.String(250), nullable=True),
    #: Exit code of the program (command tasks) or the code its exception maps to (Python tasks).
    sa.Column("exit_code", sa.Integer, nullable=True),
    #: sha256 of the DAG file that ran (which code produced which output).
    sa.Column("code_version", sa.String(64), nullable=True),
    #: Structured outputs a job left (run-output, metrics, lineage, sink-commit, error-report),
    #: sensor evidence or a quality result, by name.
    sa.Column("outputs", JSONType, nullable=True),
    sa.UniqueConstraint("task_instance_id", "attempt"),
    sa.Index(None, "run_id"),
    sa.Index(None, "ended_at"),
    info=_mysql_text(),
)

#: The element each mapped task instance runs with (its argument), written at expansion.
task_map_items = sa.Table(
    "task_map_items",
    metadata,
    sa.Column("run_id", ID, primary_key=True),
    sa.Column("task_id", ID, primary_key=True),
    sa.Column("map_index", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("value", JSONType, nullable=True),
    info=_mysql_text(),
)
task_results = sa.Table(
    "task_results",
    metadata,
    sa.Column("task_instance_id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("run_id", ID, nullable=False),
    sa.Column("task_id", ID, nullable=False),
    sa.Column("value", JSONType, nullable=True),
    sa.Column("size_bytes", sa.Integer, nullable=False),
    sa.Column("created_at", UTCDateTime, nullable=False),
    sa.Index(None, "run_id", "task_id"),
    info=_mysql_text(),
)

workers = sa.Table(
    "workers",
    metadata,
    sa.Column("worker_id", sa.String(250), primary_key=True),
    sa.Column("hostname", sa.String(250), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("queues", JSONType, nullable=False),
    sa.Column("concurrency", sa.Integer, nullable=False),
    sa.Column("prefetch", sa.Integer, nullable=False, server_default="0"),
    #: Attempts running in a child process / claimed and waiting for a free slot (at heartbeat).
    sa.Column("active", sa.Integer, nullable=False, server_default="0"),
    sa.Column("prefetched", sa.Integer, nullable=False, server_default="0"),
    sa.Column("state", sa.String(20), nullable=False),
    sa.Column("started_at", UTCDateTime, nullable=False),
    sa.Column("last_heartbeat_at", UTCDateTime, nullable=False),
    info=_mysql_text(),
)

pools = sa.Table(
    "pools",
    metadata,
    sa.Column("name", sa.String(250), primary_key=True),
    sa.Column("slots", sa.Integer, nullable=False),
    sa.Column("description", sa.Text, nullable=False, server_default=""),
    sa.Column("created_at", UTCDateTime, nullable=False),
    sa.Column("updated_at", UTCDateTime, nullable=False),
    info=_mysql_text(),
)

#: Submitted external jobs whose cancel is still owed: a cancelled or timed-out submit-then-poll
#: task's handle, until a worker serving its queue has run the task's `cancel(handle)` (0009).
job_cancellations = sa.Table(
    "job_cancellations",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("task_instance_id", sa.BigInteger, nullable=False),
    sa.Column("run_id", ID, nullable=False),
    sa.Column("dag_id", ID, nullable=False),
    sa.Column("task_id", ID, nullable=False),
    sa.Column("dag_version_id", sa.BigInteger, nullable=False),
    sa.Column("queue", sa.String(250), nullable=False),
    sa.Column("handle", JSONType, nullable=False),
    sa.Column("reason", sa.String(250), nullable=False),
    sa.Column("requested_at", UTCDateTime, nullable=False),
    #: Tries so far; the next one is not before `next_try_at`.
    sa.Column("tries", sa.Integer, nullable=False, server_default="0"),
    sa.Column("next_try_at", UTCDateTime, nullable=False),
    #: The worker running the cancel, and until when it may (another takes over after).
    sa.Column("worker_id", sa.String(250), nullable=True),
    sa.Column("lease_expires_at", UTCDateTime, nullable=True),
    sa.Column("done_at", UTCDateTime, nullable=True),
    sa.Column("error", sa.Text, nullable=True),
    sa.Index(None, "done_at", "queue", "next_try_at"),
    sa.Index(None, "run_id"),
    info=_mysql_text(),
)

#: Append-only record of who asked for what (cancellations, requeues, pool changes).
audit_log = sa.Table(
    "audit_log",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("at", UTCDateTime, nullable=False),
    sa.Column("actor", sa.String(250), nullable=False),
    sa.Column("action", sa.String(100), nullable=False),
    sa.Column("target", sa.String(500), nullable=False),
    sa.Column("details", JSONType, nullable=False),
    #: Where the request came from (the client address of an API call; NULL from the CLI).
    sa.Column("address", sa.String(100), nullable=True),
    sa.Index(None, "at"),
    sa.Index(None, "actor", "at"),
    info=_mysql_text(),
)

#: Teams own DAGs; users hold a role per team (the team `*` means every team).
teams = sa.Table(
    "teams",
    metadata,
    sa.Column("name", ID, primary_key=True),
    sa.Column("description", sa.Text, nullable=False, server_default=""),
    sa.Column("created_at", UTCDateTime, nullable=False),
    info=_mysql_text(),
)

#: People (and automation owners) who may call the API; passwords hashed with argon2.
users = sa.Table(
    "users",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("username", sa.String(100), nullable=False),
    sa.Column("password_hash", sa.String(255), nullable=False),
    sa.Column("is_active", sa.Boolean, nullable=False, server_default=sa.true()),
    #: Set for the bootstrap admin (and by `users create --temporary`): every call but the
    #: password change is refused until the password is changed.
    sa.Column("must_change_password", sa.Boolean, nullable=False, server_default=sa.false()),
    #: Bumped by a password change, role change or disabling: sessions carry the version they
    #: were issued at, so every older session ends at once on every API process.
    sa.Column("session_version", sa.Integer, nullable=False, server_default="1"),
    sa.Column("created_at", UTCDateTime, nullable=False),
    sa.Column("updated_at", UTCDateTime, nullable=False),
    sa.UniqueConstraint("username"),
    info=_mysql_text(),
)

#: A user's role in one team (`admin`, `operator`, `viewer`).
team_memberships = sa.Table(
    "team_memberships",
    metadata,
    sa.Column("user_id", sa.Integer, primary_key=True),
    sa.Column("team", ID, primary_key=True),
    sa.Column("role", sa.String(20), nullable=False),
    sa.Index(None, "team"),
    info=_mysql_text(),
)

#: API tokens: only the sha256 of the secret is stored; scoped to one team and role.
api_tokens = sa.Table(
    "api_tokens",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("token_hash", sa.String(64), nullable=False),
    sa.Column("name", sa.String(100), nullable=False),
    sa.Column("user_id", sa.Integer, nullable=False),
    sa.Column("team", ID, nullable=False),
    sa.Column("role", sa.String(20), nullable=False),
    sa.Column("created_at", UTCDateTime, nullable=False),
    sa.Column("expires_at", UTCDateTime, nullable=True),
    sa.Column("revoked_at", UTCDateTime, nullable=True),
    sa.UniqueConstraint("token_hash"),
    sa.Index(None, "user_id"),
    info=_mysql_text(),
)


#: The time-based trigger of each scheduled DAG: its spec and durable watermark (F9, F10).
schedules = sa.Table(
    "schedules",
    metadata,
    sa.Column("dag_id", ID, primary_key=True),
    #: cron, interval or dataset.
    sa.Column("kind", sa.String(20), nullable=False),
    #: The ScheduleSpec of the DAG's latest version (JSON).
    sa.Column("spec", JSONType, nullable=False),
    #: Nominal fire time of the newest slot that got a run (or was skipped by policy).
    sa.Column("last_fire_at", UTCDateTime, nullable=True),
    #: Nominal fire time of the next slot; NULL when none is due ever again (end_date passed).
    sa.Column("next_fire_at", UTCDateTime, nullable=True),
    sa.Column("updated_at", UTCDateTime, nullable=False),
    sa.Index(None, "next_fire_at"),
    info=_mysql_text(),
)

#: Named leases measured on the database clock; `scheduler` elects the leader.
leases = sa.Table(
    "leases",
    metadata,
    sa.Column("name", sa.String(100), primary_key=True),
    sa.Column("holder", sa.String(250), nullable=True),
    #: Bumped at every change of holder: the fencing token written with each leader insert.
    sa.Column("epoch", sa.Integer, nullable=False, server_default="0"),
    sa.Column("acquired_at", UTCDateTime, nullable=True),
    sa.Column("renewed_at", UTCDateTime, nullable=True),
    sa.Column("expires_at", UTCDateTime, nullable=True),
    info=_mysql_text(),
)

#: A request to run a DAG over a range of past intervals, drained by the leader.
backfills = sa.Table(
    "backfills",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("dag_id", ID, nullable=False),
    #: Logical dates from .. to (inclusive) of the intervals to run.
    sa.Column("from_date", UTCDateTime, nullable=False),
    sa.Column("to_date", UTCDateTime, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("requested_by", sa.String(250), nullable=False),
    #: normal or shadow.
    sa.Column("mode", sa.String(20), nullable=False),
    #: none (skip intervals that have a run), failed (clear failed runs) or all (clear every run).
    sa.Column("rerun", sa.String(20), nullable=False),
    #: Most runs of this backfill active at once (its own budget, apart from max_active_runs).
    sa.Column("max_active", sa.Integer, nullable=False),
    #: running, paused, cancelled, done.
    sa.Column("state", sa.String(20), nullable=False),
    sa.Column("total", sa.Integer, nullable=False),
    #: Intervals handled so far (a run created, an existing run cleared, or skipped).
    sa.Column("handled", sa.Integer, nullable=False, server_default="0"),
    #: Fire time of the next interval to handle; NULL once every interval is handled.
    sa.Column("cursor", UTCDateTime, nullable=True),
    sa.Column("created_at", UTCDateTime, nullable=False),
    sa.Column("updated_at", UTCDateTime, nullable=False),
    sa.Column("ended_at", UTCDateTime, nullable=True),
    sa.Index(None, "state"),
    sa.Index(None, "dag_id", "created_at"),
    info=_mysql_text(),
)

#: A dataset (asset) some task declares as an outlet.
datasets = sa.Table(
    "datasets",
    metadata,
    sa.Column("name", sa.String(500), primary_key=True),
    sa.Column("created_at", UTCDateTime, nullable=False),
    sa.Column("last_event_id", sa.BigInteger, nullable=True),
    sa.Column("last_event_at", UTCDateTime, nullable=True),
    info=_mysql_text(),
)

#: The team that owns each dataset (only its DAGs, and granted teams' DAGs, may emit to it).
dataset_owners = sa.Table(
    "dataset_owners",
    metadata,
    sa.Column("dataset", sa.String(500), primary_key=True),
    sa.Column("team", ID, nullable=False),
    sa.Column("created_at", UTCDateTime, nullable=False),
    sa.Column("created_by", sa.String(250), nullable=False),
    info=_mysql_text(),
)

#: Teams other than the owner whose DAGs may emit to a dataset.
dataset_grants = sa.Table(
    "dataset_grants",
    metadata,
    sa.Column("dataset", sa.String(500), primary_key=True),
    sa.Column("team", ID, primary_key=True),
    sa.Column("created_at", UTCDateTime, nullable=False),
    sa.Column("created_by", sa.String(250), nullable=False),
    info=_mysql_text(),
)

#: Append-only: one row per successful producing task (its run, optional version and metadata).
dataset_events = sa.Table(
    "dataset_events",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("dataset", sa.String(500), nullable=False),
    sa.Column("run_id", ID, nullable=True),
    sa.Column("dag_id", ID, nullable=True),
    sa.Column("task_id", ID, nullable=True),
    sa.Column("version", sa.String(250), nullable=True),
    sa.Column("extra", JSONType, nullable=False),
    sa.Column("created_at", UTCDateTime, nullable=False),
    sa.Index(None, "dataset", "id"),
    info=_mysql_text(),
)

#: Per dataset-scheduled DAG and dataset: the newest event its runs have consumed.
dataset_consumers = sa.Table(
    "dataset_consumers",
    metadata,
    sa.Column("dag_id", ID, primary_key=True),
    sa.Column("dataset", sa.String(500), primary_key=True),
    sa.Column("last_event_id", sa.BigInteger, nullable=False, server_default="0"),
    info=_mysql_text(),
)

#: Side effects that leave the system (dataset events, dead-letter alerts), written in the
#: transaction of the change that causes them and delivered by the leader's relay (0013).
#: One row per freshness SLO miss alerted: a DAG's output stale since a given newest event;
#: `key` is the sha256 of the three, so the leader alerts a miss once.
freshness_alerts = sa.Table(
    "freshness_alerts",
    metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("dag_id", sa.String(250), nullable=False),
    sa.Column("dataset", sa.String(500), nullable=False),
    #: The newest event's time (ISO 8601) the miss is about.
    sa.Column("period", sa.String(64), nullable=False),
    sa.Column("alerted_at", UTCDateTime, nullable=False),
    info=_mysql_text(),
)


#: Every alert a rule raised about an occurrence (migration 0016): once per rule and occurrence
#: (`key`), and the last one sent per rule and subject is what repeats are deduplicated against.
alert_firings = sa.Table(
    "alert_firings",
    metadata,
    #: sha256 of the rule id and the occurrence's key.
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("rule", sa.String(120), nullable=False),
    sa.Column("subject", sa.String(500), nullable=False),
    sa.Column("kind", sa.String(40), nullable=False),
    sa.Column("dag_id", ID, nullable=False),
    sa.Column("run_id", ID, nullable=True),
    #: sent, duplicate (within the rule's window) or backfill (held back).
    sa.Column("disposition", sa.String(16), nullable=False),
    sa.Column("fired_at", UTCDateTime, nullable=False),
    sa.Index(None, "rule", "subject", "fired_at"),
    info=_mysql_text(),
)


outbox = sa.Table(
    "outbox",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("kind", sa.String(100), nullable=False),
    sa.Column("sink", sa.String(100), nullable=False),
    sa.Column("payload", JSONType, nullable=False),
    #: pending, delivered or dead.
    sa.Column("state", sa.String(20), nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("next_attempt_at", UTCDateTime, nullable=False),
    #: While a relay delivers the entry: its acknowledgement deadline (then anyone may retry).
    sa.Column("claimed_until", UTCDateTime, nullable=True),
    #: The leader epoch of the relay that last claimed it (its settle is fenced on it).
    sa.Column("leader_epoch", sa.BigInteger, nullable=True),
    sa.Column("last_error", sa.String(2000), nullable=True),
    sa.Column("created_at", UTCDateTime, nullable=False),
    sa.Column("delivered_at", UTCDateTime, nullable=True),
    sa.Index(None, "state", "next_attempt_at"),
    info=_mysql_text(),
)

#: Idempotency-Key claims of the API (0015): one row per (caller, route, key), written in the
#: transaction that made the change, then completed with the response a retry gets back.
#: `key_hash` is the sha256 of the three, so the primary key stays short on every database.
idempotency_keys = sa.Table(
    "idempotency_keys",
    metadata,
    sa.Column("key_hash", sa.String(64), primary_key=True),
    #: sha256 of what the request asked (method, path, canonical body): a reuse must match it.
    sa.Column("fingerprint", sa.String(64), nullable=False),
    #: The method and path of that request, for the message when a key is reused elsewhere.
    sa.Column("request_line", sa.String(500), nullable=False),
    #: A random token of the request that claimed the key (a retry of it is another request).
    sa.Column("claim", sa.String(32), nullable=False),
    #: The response once recorded; NULL while the claiming request has not answered.
    sa.Column("status_code", sa.Integer, nullable=True),
    sa.Column("response", JSONType, nullable=True),
    sa.Column("created_at", UTCDateTime, nullable=False),
    sa.Column("expires_at", UTCDateTime, nullable=False),
    sa.Index(None, "expires_at"),
    info=_mysql_text(),
)


_bound_dialects: set[str] = set()
_bind_lock = threading.Lock()


def bind_dialect(name: str) -> None:
    """Attach the options that only dialect `name`'s DDL reads (DIALECT_OPTIONS) to the tables
    and indexes that declare them; the drift check, autogenerate and `db upgrade --sql` see
    them from then on. Called by whatever opens a database of that dialect; idempotent."""
    with _bind_lock:
        if name in _bound_dialects:
            return
        for table in metadata.tables.values():
            items: tuple[sa.Table | sa.Index, ...] = (table, *table.indexes)
            for item in items:
                for key, value in item.info.get(DIALECT_OPTIONS, {}).get(name, {}).items():
                    item.dialect_kwargs[f"{name}_{key}"] = value
        _bound_dialects.add(name)
