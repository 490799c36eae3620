"""Idempotency-Key claims of the API

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

import treadle.store.tables

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

MYSQL_OPTIONS: dict[str, Any] = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def upgrade() -> None:
    op.create_table(
        "idempotency_keys",
        sa.Column("key_hash", sa.String(64), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("request_line", sa.String(500), nullable=False),
        sa.Column("claim", sa.String(32), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("response", treadle.store.tables.JSONType, nullable=True),
        sa.Column("created_at", treadle.store.tables.UTCDateTime(timezone=True), nullable=False),
        sa.Column("expires_at", treadle.store.tables.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key_hash", name=op.f("pk_idempotency_keys")),
        **MYSQL_OPTIONS,
    )
    op.create_index(op.f("ix_idempotency_keys_expires_at"), "idempotency_keys", ["expires_at"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_idempotency_keys_expires_at"), table_name="idempotency_keys")
    op.drop_table("idempotency_keys")
