"""Task instances record the database time of their attempt's last lease renewal

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import treadle.store.tables

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # The reaper tells a crash (lost) from a deadline overrun (timed_out) by this time.
    with op.batch_alter_table("task_instances") as batch:
        batch.add_column(
            sa.Column("heartbeat_at", treadle.store.tables.UTCDateTime(timezone=True), nullable=True)
        )


def downgrade() -> None:
    with op.batch_alter_table("task_instances") as batch:
        batch.drop_column("heartbeat_at")
