"""Freshness SLO misses already alerted (one alert per miss)

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

import treadle.store.tables

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

MYSQL_OPTIONS: dict[str, Any] = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def upgrade() -> None:
    op.create_table(
        "freshness_alerts",
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("dag_id", sa.String(250), nullable=False),
        sa.Column("dataset", sa.String(500), nullable=False),
        sa.Column("period", sa.String(64), nullable=False),
        sa.Column("alerted_at", treadle.store.tables.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_freshness_alerts")),
        **MYSQL_OPTIONS,
    )


def downgrade() -> None:
    op.drop_table("freshness_alerts")
