"""The Slack sink: each alert POSTed to TREADLE_ALERT_SLACK_URL as Slack's message body
(`{"text": ..., "blocks": [...]}`, domain/alerts.slack_body), which an incoming webhook posts to
its channel; any receiver of that body (Mattermost, a chat bridge) works too. Alerts only: the
outbox writes no other entries for this sink. Any 2xx within the acknowledgement deadline is a
delivery (posted over kept-alive connections, delivery/http.py).
"""

from __future__ import annotations

import json

from treadle.delivery.http import KeepAlivePoster
from treadle.domain.alerts import slack_body
from treadle.domain.outbox import OutboxEntry

#: The sink name entries for this sink carry.
SINK = "slack"


class SlackSink:
    """Posts alerts to `url` (connections kept alive; safe to share between threads)."""

    def __init__(self, url: str, *, ack_s: float) -> None:
        self.url = url
        self.poster = KeepAlivePoster(url, ack_s=ack_s, name="Slack")

    def deliver(self, entry: OutboxEntry) -> str | None:
        """Post one alert; None when the receiver took it, else what went wrong."""
        body = json.dumps(slack_body(entry.payload), default=str).encode()
        return self.poster.post(body, {"Content-Type": "application/json"})

    def close(self) -> None:
        """Close the kept-alive connections."""
        self.poster.close()
