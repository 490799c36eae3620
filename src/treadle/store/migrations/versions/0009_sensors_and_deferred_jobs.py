"""Sensors and submit-then-poll tasks: first poke time, poll handle, owed job cancellations

Revision ID: 0009
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import treadle.store.tables

revision = "0009"
down_revision = "0007"
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
_MYSQL_TABLE: dict[str, Any] = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}
_TIME = treadle.store.tables.UTCDateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("task_instances", schema=None) as batch_op:
        batch_op.add_column(sa.Column("first_poke_at", _TIME, nullable=True))
        batch_op.add_column(sa.Column("poll_handle", _JSON, nullable=True))
    op.create_table(
        "job_cancellations",
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False
        ),
        sa.Column("task_instance_id", sa.BigInteger(), nullable=False),
        sa.Column("run_id", sa.String(length=250), nullable=False),
        sa.Column("dag_id", sa.String(length=250), nullable=False),
        sa.Column("task_id", sa.String(length=250), nullable=False),
        sa.Column("dag_version_id", sa.BigInteger(), nullable=False),
        sa.Column("queue", sa.String(length=250), nullable=False),
        sa.Column("handle", _JSON, nullable=False),
        sa.Column("reason", sa.String(length=250), nullable=False),
        sa.Column("requested_at", _TIME, nullable=False),
        sa.Column("tries", sa.Integer(), server_default="0", nullable=False),
        sa.Column("next_try_at", _TIME, nullable=False),
        sa.Column("worker_id", sa.String(length=250), nullable=True),
        sa.Column("lease_expires_at", _TIME, nullable=True),
        sa.Column("done_at", _TIME, nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_cancellations")),
        **_MYSQL_TABLE,
    )
    with op.batch_alter_table("job_cancellations", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_job_cancellations_done_at_queue_next_try_at"),
            ["done_at", "queue", "next_try_at"],
            unique=False,
        )
        batch_op.create_index(batch_op.f("ix_job_cancellations_run_id"), ["run_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("job_cancellations", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_job_cancellations_run_id"))
        batch_op.drop_index(batch_op.f("ix_job_cancellations_done_at_queue_next_try_at"))
    op.drop_table("job_cancellations")
    with op.batch_alter_table("task_instances", schema=None) as batch_op:
        batch_op.drop_column("poll_handle")
        batch_op.drop_column("first_poke_at")
