"""Per-queue depth and age (what `treadle queues` shows)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from treadle.domain.states import TaskState
from treadle.store.tables import task_instances as ti


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueStats:
    """Depth of one queue."""

    queue: str
    queued: int
    running: int
    oldest_queued_at: datetime | None


def queue_stats(conn: Connection) -> list[QueueStats]:
    """Queued and running counts and the oldest queued time, per queue with any."""
    rows = conn.execute(
        sa.select(ti.c.queue, ti.c.state, sa.func.count(), sa.func.min(ti.c.queued_at))
        .where(ti.c.state.in_([TaskState.QUEUED.value, TaskState.RUNNING.value]))
        .group_by(ti.c.queue, ti.c.state)
    )
    queued: dict[str, int] = {}
    running: dict[str, int] = {}
    oldest: dict[str, datetime | None] = {}
    for queue, state, count, first in rows:
        if state == TaskState.QUEUED.value:
            queued[queue], oldest[queue] = int(count), _aware(first)
        else:
            running[queue] = int(count)
    return [
        QueueStats(
            queue=q, queued=queued.get(q, 0), running=running.get(q, 0), oldest_queued_at=oldest.get(q)
        )
        for q in sorted(set(queued) | set(running))
    ]


def _aware(value: object) -> datetime | None:
    """MIN() over a timestamp: text on SQLite, naive or aware elsewhere."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if not isinstance(value, datetime):
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value
