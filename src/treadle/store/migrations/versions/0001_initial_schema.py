"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-30 01:06:36.492098
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql, postgresql

import treadle.store.tables

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

#: utf8mb4 with binary (case-sensitive) comparison on MySQL; ignored by other dialects.
_MYSQL_TABLE: dict[str, Any] = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}
#: A double on MySQL, whose plain FLOAT is single precision.
_SECONDS = sa.Float().with_variant(mysql.DOUBLE(asdecimal=False), "mysql")


def upgrade() -> None:
    op.create_table(
        "dag_load_errors",
        sa.Column(
            "fileloc", sa.String(length=1000).with_variant(mysql.VARCHAR(768), "mysql"), nullable=False
        ),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("traceback", sa.Text(), nullable=False),
        sa.Column("recorded_at", treadle.store.tables.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("fileloc", name=op.f("pk_dag_load_errors")),
        **_MYSQL_TABLE,
    )
    op.create_table(
        "dag_runs",
        sa.Column("run_id", sa.String(length=250), nullable=False),
        sa.Column("dag_id", sa.String(length=250), nullable=False),
        sa.Column("dag_version_id", sa.Integer(), nullable=False),
        sa.Column("run_type", sa.String(length=20), nullable=False),
        sa.Column("logical_date", treadle.store.tables.UTCDateTime(timezone=True), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column(
            "conf",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("triggered_by", sa.String(length=250), nullable=False),
        sa.Column("created_at", treadle.store.tables.UTCDateTime(timezone=True), nullable=False),
        sa.Column("started_at", treadle.store.tables.UTCDateTime(timezone=True), nullable=True),
        sa.Column("ended_at", treadle.store.tables.UTCDateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_dag_runs")),
        sa.UniqueConstraint(
            "dag_id",
            "logical_date",
            "run_type",
            name=op.f("uq_dag_runs_dag_id_logical_date_run_type"),
        ),
        **_MYSQL_TABLE,
    )
    with op.batch_alter_table("dag_runs", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_dag_runs_dag_id_created_at"), ["dag_id", "created_at"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_dag_runs_state"), ["state"], unique=False)

    op.create_table(
        "dag_versions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("dag_id", sa.String(length=250), nullable=False),
        sa.Column("version_hash", sa.String(length=64), nullable=False),
        sa.Column(
            "structure",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("created_at", treadle.store.tables.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dag_versions")),
        sa.UniqueConstraint("dag_id", "version_hash", name=op.f("uq_dag_versions_dag_id_version_hash")),
        **_MYSQL_TABLE,
    )
    op.create_table(
        "dags",
        sa.Column("dag_id", sa.String(length=250), nullable=False),
        sa.Column("owner", sa.String(length=250), nullable=False),
        sa.Column("description", sa.Text(), server_default="", nullable=False),
        sa.Column(
            "tags",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("fileloc", sa.Text(), server_default="", nullable=False),
        sa.Column("is_paused", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("is_active", sa.Boolean(), server_default=sa.true(), nullable=False),
        sa.Column("latest_version_id", sa.Integer(), nullable=True),
        sa.Column("updated_at", treadle.store.tables.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("dag_id", name=op.f("pk_dags")),
        **_MYSQL_TABLE,
    )
    op.create_table(
        "task_attempts",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("task_instance_id", sa.BigInteger(), nullable=False),
        sa.Column("run_id", sa.String(length=250), nullable=False),
        sa.Column("dag_id", sa.String(length=250), nullable=False),
        sa.Column("task_id", sa.String(length=250), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("outcome", sa.String(length=20), nullable=False),
        sa.Column("error_type", sa.String(length=250), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("traceback", sa.Text(), nullable=True),
        sa.Column("fingerprint", sa.String(length=40), nullable=True),
        sa.Column("worker_id", sa.String(length=250), nullable=True),
        sa.Column("hostname", sa.String(length=250), nullable=True),
        sa.Column("started_at", treadle.store.tables.UTCDateTime(timezone=True), nullable=True),
        sa.Column("ended_at", treadle.store.tables.UTCDateTime(timezone=True), nullable=False),
        sa.Column("duration_s", _SECONDS, nullable=True),
        sa.Column("retry_delay_s", _SECONDS, nullable=True),
        sa.Column("late_result", sa.String(length=250), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_task_attempts")),
        sa.UniqueConstraint(
            "task_instance_id", "attempt", name=op.f("uq_task_attempts_task_instance_id_attempt")
        ),
        **_MYSQL_TABLE,
    )
    with op.batch_alter_table("task_attempts", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_task_attempts_ended_at"), ["ended_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_task_attempts_run_id"), ["run_id"], unique=False)

    op.create_table(
        "task_instances",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("run_id", sa.String(length=250), nullable=False),
        sa.Column("dag_id", sa.String(length=250), nullable=False),
        sa.Column("task_id", sa.String(length=250), nullable=False),
        sa.Column("map_index", sa.Integer(), server_default="-1", nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("attempt", sa.Integer(), server_default="0", nullable=False),
        sa.Column("budget_base", sa.Integer(), server_default="0", nullable=False),
        sa.Column("orphaned_count", sa.Integer(), server_default="0", nullable=False),
        sa.Column("queue", sa.String(length=250), server_default="default", nullable=False),
        sa.Column("priority_weight", sa.Integer(), server_default="1", nullable=False),
        sa.Column("upstream_total", sa.Integer(), server_default="0", nullable=False),
        sa.Column("upstream_done", sa.Integer(), server_default="0", nullable=False),
        sa.Column("queued_at", treadle.store.tables.UTCDateTime(timezone=True), nullable=True),
        sa.Column("next_attempt_at", treadle.store.tables.UTCDateTime(timezone=True), nullable=True),
        sa.Column("started_at", treadle.store.tables.UTCDateTime(timezone=True), nullable=True),
        sa.Column("ended_at", treadle.store.tables.UTCDateTime(timezone=True), nullable=True),
        sa.Column("worker_id", sa.String(length=250), nullable=True),
        sa.Column("hostname", sa.String(length=250), nullable=True),
        sa.Column("lease_expires_at", treadle.store.tables.UTCDateTime(timezone=True), nullable=True),
        sa.Column("timeout_s", _SECONDS, nullable=True),
        sa.Column("timeout_at", treadle.store.tables.UTCDateTime(timezone=True), nullable=True),
        sa.Column("dead_letter_reason", sa.String(length=40), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_task_instances")),
        sa.UniqueConstraint(
            "run_id",
            "task_id",
            "map_index",
            name=op.f("uq_task_instances_run_id_task_id_map_index"),
        ),
        **_MYSQL_TABLE,
    )
    with op.batch_alter_table("task_instances", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_task_instances_run_id_state"), ["run_id", "state"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_task_instances_state_lease_expires_at"),
            ["state", "lease_expires_at"],
            unique=False,
        )
        batch_op.create_index(
            batch_op.f("ix_task_instances_state_next_attempt_at"),
            ["state", "next_attempt_at"],
            unique=False,
        )
        batch_op.create_index(
            batch_op.f("ix_task_instances_state_queue_priority_weight_queued_at"),
            ["state", "queue", "priority_weight", "queued_at"],
            unique=False,
        )

    op.create_table(
        "task_results",
        sa.Column("task_instance_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("run_id", sa.String(length=250), nullable=False),
        sa.Column("task_id", sa.String(length=250), nullable=False),
        sa.Column(
            "value",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("size_bytes", sa.Integer(), nullable=False),
        sa.Column("created_at", treadle.store.tables.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("task_instance_id", name=op.f("pk_task_results")),
        **_MYSQL_TABLE,
    )
    with op.batch_alter_table("task_results", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_task_results_run_id_task_id"), ["run_id", "task_id"], unique=False
        )

    op.create_table(
        "workers",
        sa.Column("worker_id", sa.String(length=250), nullable=False),
        sa.Column("hostname", sa.String(length=250), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column(
            "queues",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("started_at", treadle.store.tables.UTCDateTime(timezone=True), nullable=False),
        sa.Column("last_heartbeat_at", treadle.store.tables.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("worker_id", name=op.f("pk_workers")),
        **_MYSQL_TABLE,
    )


def downgrade() -> None:
    op.drop_table("workers")
    with op.batch_alter_table("task_results", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_task_results_run_id_task_id"))

    op.drop_table("task_results")
    with op.batch_alter_table("task_instances", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_task_instances_state_queue_priority_weight_queued_at"))
        batch_op.drop_index(batch_op.f("ix_task_instances_state_next_attempt_at"))
        batch_op.drop_index(batch_op.f("ix_task_instances_state_lease_expires_at"))
        batch_op.drop_index(batch_op.f("ix_task_instances_run_id_state"))

    op.drop_table("task_instances")
    with op.batch_alter_table("task_attempts", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_task_attempts_run_id"))
        batch_op.drop_index(batch_op.f("ix_task_attempts_ended_at"))

    op.drop_table("task_attempts")
    op.drop_table("dags")
    op.drop_table("dag_versions")
    with op.batch_alter_table("dag_runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_dag_runs_state"))
        batch_op.drop_index(batch_op.f("ix_dag_runs_dag_id_created_at"))

    op.drop_table("dag_runs")
    op.drop_table("dag_load_errors")
