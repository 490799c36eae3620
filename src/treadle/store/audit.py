"""The audit log: append-only record of who asked for what."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.store.tables import audit_log


def record(
    conn: Connection,
    *,
    at: datetime,
    actor: str,
    action: str,
    target: str,
    details: dict[str, Any] | None = None,
) -> None:
    """Append one entry (in the caller's transaction, with the change it describes)."""
    conn.execute(
        sa.insert(audit_log).values(
            at=at, actor=actor[:250], action=action, target=target[:500], details=details or {}
        )
    )
