"""The outbox: side effects written with the change that causes them, delivered by the leader

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

import treadle.store.tables

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

MYSQL_OPTIONS: dict[str, Any] = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def _time() -> treadle.store.tables.UTCDateTime:
    return treadle.store.tables.UTCDateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "outbox",
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), autoincrement=True, nullable=False
        ),
        sa.Column("kind", sa.String(100), nullable=False),
        sa.Column("sink", sa.String(100), nullable=False),
        sa.Column("payload", treadle.store.tables.JSONType, nullable=False),
        sa.Column("state", sa.String(20), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("next_attempt_at", _time(), nullable=False),
        sa.Column("claimed_until", _time(), nullable=True),
        sa.Column("leader_epoch", sa.BigInteger, nullable=True),
        sa.Column("last_error", sa.String(2000), nullable=True),
        sa.Column("created_at", _time(), nullable=False),
        sa.Column("delivered_at", _time(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_outbox")),
        **MYSQL_OPTIONS,
    )
    op.create_index(op.f("ix_outbox_state_next_attempt_at"), "outbox", ["state", "next_attempt_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_outbox_state_next_attempt_at"), table_name="outbox")
    op.drop_table("outbox")
