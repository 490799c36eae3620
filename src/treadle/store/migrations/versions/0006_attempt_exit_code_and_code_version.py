"""Attempts record their exit code, the code version that ran and the job's structured outputs

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

JSONType = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("task_attempts") as batch:
        batch.add_column(sa.Column("exit_code", sa.Integer, nullable=True))
        batch.add_column(sa.Column("code_version", sa.String(64), nullable=True))
        batch.add_column(sa.Column("outputs", JSONType, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("task_attempts") as batch:
        batch.drop_column("outputs")
        batch.drop_column("code_version")
        batch.drop_column("exit_code")
