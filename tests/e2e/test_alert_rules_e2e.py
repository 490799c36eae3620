"""Alert rules with real processes: the deployment's rules from TREADLE_ALERT_RULES, the leader's
check of lasting states run by a real scheduler, the alert posted to a generic webhook and, as
Slack's body, to a Slack receiver, each with its link into the UI."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import Cluster
from tests.helpers.wait import wait_for
from tests.helpers.webhook import Receiver

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

DAG = """
    from treadle import UnknownCommit, dag, task


    @task
    def transfer() -> None:
        raise UnknownCommit("the bank did not answer after the transfer was sent")


    @dag(dag_id="payouts", owner="payments", failure_impact="sellers are paid late",
         runbook_url="https://runbooks.example/payouts")
    def payouts() -> None:
        transfer()


    payouts()
"""


@pytest.fixture
def receivers() -> Iterator[tuple[Receiver, Receiver]]:
    hook, slack = Receiver(path="/hook"), Receiver(path="/slack")
    yield hook, slack
    hook.close()
    slack.close()


def test_the_leader_alerts_an_instance_awaiting_inspection(
    tmp_path: Path, cluster: Callable[..., Cluster], receivers: tuple[Receiver, Receiver]
) -> None:
    hook, slack = receivers
    c = cluster(
        f"sqlite:///{tmp_path / 'alerts.db'}",
        TREADLE_OUTBOX_WEBHOOK_URL=hook.url,
        TREADLE_ALERT_SLACK_URL=slack.url,
        TREADLE_ALERT_RULES="needs_inspection severity=critical, dead_letter",
        TREADLE_ALERT_CHECK_SECONDS="1",
        TREADLE_UI_BASE_URL="https://treadle.example",
    )
    c.write_dag("payouts.py", DAG)
    assert c.cli("db", "upgrade").returncode == 0
    c.start("scheduler", "scheduler")
    c.worker("worker")
    c.wait_dag("payouts")
    run_id = c.trigger("payouts")
    wait_for(lambda: hook.received and slack.received, timeout=60, message="the alert at both receivers")
    (document,) = hook.bodies()
    assert document["kind"] == "alert.needs_inspection"
    alert = document["payload"]
    assert (alert["severity"], alert["pipeline"], alert["run_id"], alert["task_id"]) == (
        "critical",
        "payouts",
        run_id,
        "transfer",
    )
    assert alert["impact"] == "sellers are paid late" and alert["owner"] == "payments"
    assert alert["runbook_url"] == "https://runbooks.example/payouts"
    assert alert["ui_url"] == f"https://treadle.example/runs/{run_id}/tasks/transfer"
    assert f"treadle tasks resolve {run_id} transfer" in alert["next_action"]
    (message,) = slack.bodies()
    assert message["text"].startswith(":rotating_light: [CRITICAL]") and "payouts.transfer" in message["text"]
    assert "https://treadle.example/runs/" in str(message["blocks"])
    shown = c.cli("config", "show")
    assert "needs_inspection severity=critical" in shown.stdout, shown.stdout
