"""Alerts raised by declarative rules: one per rule and occurrence, repeats deduplicated

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

import treadle.store.tables

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

MYSQL_OPTIONS: dict[str, Any] = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def upgrade() -> None:
    op.create_table(
        "alert_firings",
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("rule", sa.String(120), nullable=False),
        sa.Column("subject", sa.String(500), nullable=False),
        sa.Column("kind", sa.String(40), nullable=False),
        sa.Column("dag_id", sa.String(250), nullable=False),
        sa.Column("run_id", sa.String(250), nullable=True),
        sa.Column("disposition", sa.String(16), nullable=False),
        sa.Column("fired_at", treadle.store.tables.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_alert_firings")),
        **MYSQL_OPTIONS,
    )
    op.create_index(
        op.f("ix_alert_firings_rule_subject_fired_at"), "alert_firings", ["rule", "subject", "fired_at"]
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_alert_firings_rule_subject_fired_at"), table_name="alert_firings")
    op.drop_table("alert_firings")
