"""Trigger rules count failed and skipped upstreams; mapped task instances keep their element

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

JSONType = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    # Rows from before this revision never saw a failed or skipped upstream while pending: a
    # failure made them upstream_failed at once, so zero is their true count.
    with op.batch_alter_table("task_instances") as batch:
        batch.add_column(sa.Column("upstream_failures", sa.Integer, nullable=False, server_default="0"))
        batch.add_column(sa.Column("upstream_skips", sa.Integer, nullable=False, server_default="0"))
    op.create_table(
        "task_map_items",
        sa.Column("run_id", sa.String(length=250), nullable=False),
        sa.Column("task_id", sa.String(length=250), nullable=False),
        sa.Column("map_index", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("value", JSONType, nullable=True),
        sa.PrimaryKeyConstraint("run_id", "task_id", "map_index", name=op.f("pk_task_map_items")),
        mysql_charset="utf8mb4",
        mysql_collate="utf8mb4_bin",
    )


def downgrade() -> None:
    op.drop_table("task_map_items")
    with op.batch_alter_table("task_instances") as batch:
        batch.drop_column("upstream_skips")
        batch.drop_column("upstream_failures")
