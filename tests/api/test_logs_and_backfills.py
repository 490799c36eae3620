"""Attempt logs paged by byte offset and followed while running; backfills requested over HTTP."""

from __future__ import annotations

import warnings
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.api.conftest import SECRET, Api
from treadle.api.app import create_app
from treadle.api.settings import ApiSettings
from treadle.domain.admission import AdmissionLimits
from treadle.engine import accounts
from treadle.engine.attempt_logs import locate_attempt
from treadle.engine.execution import claim_task_instances, complete_attempts
from treadle.engine.log_pages import whole_characters

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _client(api: Api, logs_dir: Path | None = None, **state: object) -> TestClient:
    return TestClient(create_app(api.db, ApiSettings(), secret_key=SECRET, logs_dir=logs_dir, **state))  # type: ignore[arg-type]


def test_a_running_attempts_log_is_followed_by_offset_until_complete(api: Api, tmp_path: Path) -> None:
    client = _client(api, tmp_path)
    h = api.as_("fin_viewer")
    run_id = client.post("/api/v1/dags/fin_report/runs", json={}, headers=api.as_("fin_operator")).json()[
        "run_id"
    ]
    url = f"/api/v1/runs/{run_id}/tasks/step/logs"
    not_started = client.get(url, headers=h)
    assert not_started.status_code == 400 and "not started" in not_started.json()["detail"]
    [claimed] = claim_task_instances(
        db := api.db, worker_id="w", hostname="h", queues=["default"], limit=1, lease_s=60
    )
    # Running, no file yet: an empty, incomplete page.
    empty = client.get(url, headers=h).json()
    assert (empty["text"], empty["next_offset"], empty["running"], empty["complete"]) == ("", 0, True, False)
    path = locate_attempt(db, run_id, "step").log_path(tmp_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes("first line\nnaïve ".encode())
    page = client.get(url, params={"limit": 14}, headers=h).json()
    # 16 bytes would cut the two-byte ï: the page stops before it.
    assert page["text"] == "first line\nna" and page["next_offset"] == 13 and not page["complete"]
    with path.open("ab") as log:
        log.write(b"second line\n")
    rest = client.get(url, params={"offset": page["next_offset"]}, headers=h).json()
    assert rest["text"] == "ïve second line\n" and rest["running"] and not rest["complete"]
    complete_attempts(db, [(claimed, 1)], worker_id="w", hostname="h")
    tail = client.get(url, params={"offset": rest["next_offset"]}, headers=h).json()
    assert (tail["text"], tail["running"], tail["complete"]) == ("", False, True)
    whole = client.get(url, params={"attempt": 1}, headers=h).json()
    assert whole["text"] == "first line\nnaïve second line\n" and whole["complete"]
    assert client.get(url, headers=api.as_("ops_operator")).status_code == 403
    assert client.get(url, params={"offset": 10_000}, headers=h).status_code == 400
    assert client.get(url, params={"attempt": 2}, headers=h).status_code == 400
    # Another host's API (another logs folder) cannot serve it, and says so.
    elsewhere = _client(api, tmp_path / "elsewhere").get(url, headers=h)
    assert elsewhere.status_code == 404 and "ran on h" in elsewhere.json()["detail"]


def test_whole_characters_never_splits_a_utf8_character() -> None:
    text = "aé€😀".encode()
    cuts = [whole_characters(text[:n]) for n in range(len(text) + 1)]
    assert cuts == [0, 1, 1, 3, 3, 3, 6, 6, 6, 6, 10]
    assert whole_characters(b"\xff\xfe") == 2  # invalid bytes are kept


def _backfill(hours_ago_from: int, hours_ago_to: int) -> dict[str, object]:
    """A range of whole hours back from now, its ends at half past: never on ops_daily's 02:00,
    so a range of N days holds N of its runs at any hour of the day."""
    now = datetime.now(UTC).replace(minute=30, second=0, microsecond=0)
    return {
        "from_date": (now - timedelta(hours=hours_ago_from)).isoformat(),
        "to_date": (now - timedelta(hours=hours_ago_to)).isoformat(),
        "reason": "reload of the orders table",
    }


def test_backfills_are_planned_created_paused_and_cancelled_over_http(api: Api) -> None:
    client = _client(api, admission=AdmissionLimits(per_dag=1))
    op, viewer = api.as_("admin"), api.as_("fin_viewer")
    body = {**_backfill(24 * 5, 24), "max_active": 2}
    plan = client.post("/api/v1/dags/ops_daily/backfills/dry-run", json=body, headers=op)
    assert plan.status_code == 200, plan.text
    dates = [i["logical_date"] for i in plan.json()["intervals"]]
    assert len(dates) == 4 and all(i["action"] == "create" for i in plan.json()["intervals"])
    assert client.get("/api/v1/backfills", headers=op).json() == []
    # Two runs at once would queue two instances of ops_daily: over the DAG limit of 1.
    refused = client.post("/api/v1/dags/ops_daily/backfills", json=body, headers=op)
    assert refused.status_code == 429 and refused.json()["limit"]["setting"] == "TREADLE_MAX_QUEUED_PER_DAG"
    assert client.get("/api/v1/backfills", headers=op).json() == []
    made = client.post("/api/v1/dags/ops_daily/backfills", json={**body, "max_active": 1}, headers=op)
    assert made.status_code == 201, made.text
    backfill_id = made.json()["id"]
    assert made.json()["total"] == 4
    assert client.post(f"/api/v1/backfills/{backfill_id}/pause", headers=viewer).status_code == 403
    paused = client.post(f"/api/v1/backfills/{backfill_id}/pause", headers=op).json()
    assert paused == {"backfill_id": backfill_id, "changed": True, "state": "paused"}
    again = client.post(f"/api/v1/backfills/{backfill_id}/pause", headers=op).json()
    assert again["changed"] is False
    progress = client.get(f"/api/v1/backfills/{backfill_id}", headers=op).json()
    assert progress["status"]["backfill"]["state"] == "paused" and progress["status"]["completed"] == 0
    assert client.post(f"/api/v1/backfills/{backfill_id}/unpause", headers=op).json()["state"] == "running"
    cancelled = client.post(
        f"/api/v1/backfills/{backfill_id}/cancel", json={"reason": "wrong range"}, headers=op
    )
    assert cancelled.status_code == 200 and cancelled.json()["changed"] is True
    actions = [
        e.action for e in accounts.list_audit(api.db, limit=100) if e.target == f"backfill:{backfill_id}"
    ]
    assert actions == ["backfill.cancel", "backfill.unpause", "backfill.pause", "backfill.create"]
    bad = client.post("/api/v1/dags/ops_daily/backfills", json={**body, "mode": "loud"}, headers=op)
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "body.mode"
    unknown = client.post("/api/v1/backfills/999/pause", headers=op)
    assert unknown.status_code == 400 and "no backfill 999" in unknown.json()["detail"]


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("post", "/api/v1/dags/ops_daily/backfills/dry-run", {"admin"}),
        ("post", "/api/v1/dags/fin_report/backfills/dry-run", {"admin", "fin_operator"}),
    ],
)
def test_backfill_requests_follow_the_role_in_the_dags_team(
    api: Api, method: str, path: str, allowed: set[str]
) -> None:
    body = _backfill(24 * 3, 24)
    for who in ("admin", "fin_operator", "fin_viewer", "ops_operator", "nobody"):
        response = api.client.request(method.upper(), path, json=body, headers=api.as_(who))
        got = "denied" if response.status_code == 403 else "allowed"
        assert got == ("allowed" if who in allowed else "denied"), (who, response.text)
