"""Users, teams and their roles, API tokens; the audit log records the caller's address; DAGs
belong to a team

Revision ID: 0011
Revises: 0009
Create Date: 2026-12-01
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

import treadle.store.tables

revision = "0011"
down_revision = "0009"
branch_labels = None
depends_on = None

ID = sa.String(250)
MYSQL_OPTIONS: dict[str, Any] = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def _time() -> treadle.store.tables.UTCDateTime:
    return treadle.store.tables.UTCDateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("dags") as batch:
        batch.add_column(sa.Column("team", ID, nullable=False, server_default="default"))
        batch.create_index("ix_dags_team", ["team"])
    with op.batch_alter_table("audit_log") as batch:
        batch.add_column(sa.Column("address", sa.String(100), nullable=True))
        batch.create_index("ix_audit_log_actor_at", ["actor", "at"])
    op.create_table(
        "teams",
        sa.Column("name", ID, nullable=False),
        sa.Column("description", sa.Text, nullable=False, server_default=""),
        sa.Column("created_at", _time(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_teams"),
        **MYSQL_OPTIONS,
    )
    op.create_table(
        "users",
        sa.Column("id", sa.Integer, autoincrement=True, nullable=False),
        sa.Column("username", sa.String(100), nullable=False),
        sa.Column("password_hash", sa.String(255), nullable=False),
        sa.Column("is_active", sa.Boolean, nullable=False, server_default=sa.true()),
        sa.Column("must_change_password", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("session_version", sa.Integer, nullable=False, server_default="1"),
        sa.Column("created_at", _time(), nullable=False),
        sa.Column("updated_at", _time(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_users"),
        sa.UniqueConstraint("username", name="uq_users_username"),
        **MYSQL_OPTIONS,
    )
    op.create_table(
        "team_memberships",
        sa.Column("user_id", sa.Integer, nullable=False),
        sa.Column("team", ID, nullable=False),
        sa.Column("role", sa.String(20), nullable=False),
        sa.PrimaryKeyConstraint("user_id", "team", name="pk_team_memberships"),
        **MYSQL_OPTIONS,
    )
    op.create_index("ix_team_memberships_team", "team_memberships", ["team"])
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer, autoincrement=True, nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("user_id", sa.Integer, nullable=False),
        sa.Column("team", ID, nullable=False),
        sa.Column("role", sa.String(20), nullable=False),
        sa.Column("created_at", _time(), nullable=False),
        sa.Column("expires_at", _time(), nullable=True),
        sa.Column("revoked_at", _time(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_api_tokens"),
        sa.UniqueConstraint("token_hash", name="uq_api_tokens_token_hash"),
        **MYSQL_OPTIONS,
    )
    op.create_index("ix_api_tokens_user_id", "api_tokens", ["user_id"])


def downgrade() -> None:
    op.drop_table("api_tokens")
    op.drop_table("team_memberships")
    op.drop_table("users")
    op.drop_table("teams")
    with op.batch_alter_table("audit_log") as batch:
        batch.drop_index("ix_audit_log_actor_at")
        batch.drop_column("address")
    with op.batch_alter_table("dags") as batch:
        batch.drop_index("ix_dags_team")
        batch.drop_column("team")
