"""Datasets belong to a team: their owner, and the other teams granted to emit to them

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

import treadle.store.tables

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

ID = sa.String(250)
MYSQL_OPTIONS: dict[str, Any] = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def _time() -> treadle.store.tables.UTCDateTime:
    return treadle.store.tables.UTCDateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "dataset_owners",
        sa.Column("dataset", sa.String(500), nullable=False),
        sa.Column("team", ID, nullable=False),
        sa.Column("created_at", _time(), nullable=False),
        sa.Column("created_by", sa.String(250), nullable=False),
        sa.PrimaryKeyConstraint("dataset", name="pk_dataset_owners"),
        **MYSQL_OPTIONS,
    )
    op.create_table(
        "dataset_grants",
        sa.Column("dataset", sa.String(500), nullable=False),
        sa.Column("team", ID, nullable=False),
        sa.Column("created_at", _time(), nullable=False),
        sa.Column("created_by", sa.String(250), nullable=False),
        sa.PrimaryKeyConstraint("dataset", "team", name="pk_dataset_grants"),
        **MYSQL_OPTIONS,
    )


def downgrade() -> None:
    op.drop_table("dataset_grants")
    op.drop_table("dataset_owners")
