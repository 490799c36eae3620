"""The claim reads queued task instances through an index in claim order

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

QUEUED = sa.text("state = 'queued'")


def upgrade() -> None:
    # Replaces an index whose mixed sort order (priority descending, then age) the claim could not
    # use: it sorted every queued row of the queue on each claim.
    with op.batch_alter_table("task_instances") as batch:
        batch.drop_index("ix_task_instances_state_queue_priority_weight_queued_at")
    op.create_index(
        "ix_task_instances_claim_order",
        "task_instances",
        ["state", "queue", sa.text("priority_weight DESC"), "queued_at", "id"],
        postgresql_where=QUEUED,
        sqlite_where=QUEUED,
    )


def downgrade() -> None:
    op.drop_index("ix_task_instances_claim_order", table_name="task_instances")
    with op.batch_alter_table("task_instances") as batch:
        batch.create_index(
            "ix_task_instances_state_queue_priority_weight_queued_at",
            ["state", "queue", "priority_weight", "queued_at"],
        )
