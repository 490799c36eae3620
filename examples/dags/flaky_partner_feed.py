"""A pipeline that fails and dead-letters: the partner feed is never there.

Trigger it, watch `fetch_feed` retry with backoff and land in the dead-letter list
(`treadle dead-letters list --group`), while `publish` is marked upstream_failed.
Set PARTNER_FEED_READY=1 in the worker's environment and requeue to see the run recover.
"""

from __future__ import annotations

import os
from typing import Any

from treadle import TaskContext, dag, task


def alert_on_call(context: TaskContext, error: dict[str, Any]) -> None:
    """on_dead_letter callback: runs on the worker; a failure here never changes the outcome."""
    print(f"[alert] {context.dag_id}.{context.task_id} dead-lettered: {error.get('message')}")


@task(retries=2, retry_delay=1, backoff_factor=2, jitter=0.1, on_dead_letter=alert_on_call)
def fetch_feed(context: TaskContext) -> dict[str, Any]:
    """Download the partner's daily feed."""
    if os.environ.get("PARTNER_FEED_READY") != "1":
        raise FileNotFoundError(f"partner feed for run {context.run_id} is not published yet")
    return {"rows": 42}


@task
def publish(feed: dict[str, Any]) -> str:
    """Publish the feed downstream."""
    return f"published {feed['rows']} rows"


@dag(dag_id="flaky_partner_feed", owner="integrations", tags=["example", "fails"])
def flaky_partner_feed() -> None:
    publish(fetch_feed())
