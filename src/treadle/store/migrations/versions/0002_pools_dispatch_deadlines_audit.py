"""Pools, dispatch deadlines, DAG task limits, worker capacity, audit log; deadlines for old rows

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 01:39:14.211730
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql, postgresql

import treadle.store.tables

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

#: utf8mb4 with binary (case-sensitive) comparison on MySQL; ignored by other dialects.
_MYSQL_TABLE: dict[str, Any] = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}
#: A double on MySQL, whose plain FLOAT is single precision.
_SECONDS = sa.Float().with_variant(mysql.DOUBLE(asdecimal=False), "mysql")


def upgrade() -> None:
    op.create_table(
        "audit_log",
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False
        ),
        sa.Column("at", treadle.store.tables.UTCDateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(length=250), nullable=False),
        sa.Column("action", sa.String(length=100), nullable=False),
        sa.Column("target", sa.String(length=500), nullable=False),
        sa.Column(
            "details",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
        **_MYSQL_TABLE,
    )
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_audit_log_at"), ["at"], unique=False)

    op.create_table(
        "pools",
        sa.Column("name", sa.String(length=250), nullable=False),
        sa.Column("slots", sa.Integer(), nullable=False),
        sa.Column("description", sa.Text(), server_default="", nullable=False),
        sa.Column("created_at", treadle.store.tables.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", treadle.store.tables.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_pools")),
        **_MYSQL_TABLE,
    )
    with op.batch_alter_table("dag_runs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_dag_runs_ended_at"), ["ended_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_dag_runs_created_at"), ["created_at"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_dag_runs_state_created_at"), ["state", "created_at"], unique=False
        )
        batch_op.drop_index(batch_op.f("ix_dag_runs_state"))

    with op.batch_alter_table("dags", schema=None) as batch_op:
        batch_op.add_column(sa.Column("max_active_tasks", sa.Integer(), nullable=True))

    with op.batch_alter_table("task_instances", schema=None) as batch_op:
        batch_op.add_column(sa.Column("pool", sa.String(length=250), nullable=True))
        batch_op.add_column(sa.Column("pool_slots", sa.Integer(), server_default="1", nullable=False))
        batch_op.add_column(sa.Column("queue_timeout_s", _SECONDS, nullable=True))
        batch_op.add_column(
            sa.Column("dispatch_deadline", treadle.store.tables.UTCDateTime(timezone=True), nullable=True)
        )
        batch_op.create_index(batch_op.f("ix_task_instances_dag_id_state"), ["dag_id", "state"], unique=False)
        batch_op.create_index(batch_op.f("ix_task_instances_pool_state"), ["pool", "state"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_task_instances_state_dispatch_deadline"),
            ["state", "dispatch_deadline"],
            unique=False,
        )
        batch_op.create_index(
            batch_op.f("ix_task_instances_state_timeout_at"), ["state", "timeout_at"], unique=False
        )

    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.add_column(sa.Column("prefetch", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("active", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("prefetched", sa.Integer(), server_default="0", nullable=False))

    _backfill_deadlines()


#: The global queue timeout at the time of this revision, for rows queued before it.
_DEFAULT_QUEUE_TIMEOUT_S = 600


def _plus_seconds(column: str, seconds: str) -> str:
    """SQL for `column + seconds` on this dialect (seconds: a column or a literal)."""
    dialect = op.get_context().dialect.name  # works offline too (`db upgrade --sql`)
    if dialect == "sqlite":
        return f"strftime('%Y-%m-%d %H:%M:%f', {column}, '+' || ({seconds}) || ' seconds')"
    if dialect == "mysql":
        return f"TIMESTAMPADD(MICROSECOND, CAST(ROUND(({seconds}) * 1000000) AS SIGNED), {column})"
    return f"{column} + make_interval(secs => {seconds})"


def _backfill_deadlines() -> None:
    """Rows from before this revision get the deadlines they would have had (F5)."""
    op.execute(
        "UPDATE task_instances SET timeout_at = "
        + _plus_seconds("started_at", "timeout_s")
        + " WHERE state = 'running' AND timeout_s IS NOT NULL AND timeout_at IS NULL"
        " AND started_at IS NOT NULL"
    )
    op.execute(
        "UPDATE task_instances SET dispatch_deadline = "
        + _plus_seconds("queued_at", str(_DEFAULT_QUEUE_TIMEOUT_S))
        + " WHERE state = 'queued' AND dispatch_deadline IS NULL AND queued_at IS NOT NULL"
    )


def downgrade() -> None:
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.drop_column("prefetched")
        batch_op.drop_column("active")
        batch_op.drop_column("prefetch")

    with op.batch_alter_table("task_instances", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_task_instances_state_timeout_at"))
        batch_op.drop_index(batch_op.f("ix_task_instances_state_dispatch_deadline"))
        batch_op.drop_index(batch_op.f("ix_task_instances_pool_state"))
        batch_op.drop_index(batch_op.f("ix_task_instances_dag_id_state"))
        batch_op.drop_column("dispatch_deadline")
        batch_op.drop_column("queue_timeout_s")
        batch_op.drop_column("pool_slots")
        batch_op.drop_column("pool")

    with op.batch_alter_table("dags", schema=None) as batch_op:
        batch_op.drop_column("max_active_tasks")

    with op.batch_alter_table("dag_runs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_dag_runs_state"), ["state"], unique=False)
        batch_op.drop_index(batch_op.f("ix_dag_runs_state_created_at"))
        batch_op.drop_index(batch_op.f("ix_dag_runs_created_at"))
        batch_op.drop_index(batch_op.f("ix_dag_runs_ended_at"))

    op.drop_table("pools")
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_audit_log_at"))

    op.drop_table("audit_log")
