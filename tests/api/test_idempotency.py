"""Idempotency-Key: a retry gets the first response back and nothing is created twice."""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from tests.api.conftest import SECRET, Api, make_client
from tests.api.dags_for_api import fin_broken
from treadle.api.app import create_app
from treadle.api.settings import ApiSettings
from treadle.domain.admission import AdmissionLimits
from treadle.domain.idempotency import idempotent_request
from treadle.engine import idempotency, queries
from treadle.engine.runs import trigger_run
from treadle.errors import IdempotencyKeyInProgress
from treadle.store.tables import backfills, idempotency_keys
from treadle.testing import DagRunner

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
TRIGGER = "/api/v1/dags/fin_report/runs"


def _runs(api: Api, dag_id: str = "fin_report") -> int:
    return len(queries.list_runs(api.db, dag_id=dag_id, limit=1000))


def _keys(api: Api) -> list[Any]:
    with api.db.read() as conn:
        return list(conn.execute(sa.select(idempotency_keys)))


def _key(value: str) -> dict[str, str]:
    return {"Idempotency-Key": value}


def test_a_retried_trigger_gets_the_first_response_and_starts_one_run(api: Api) -> None:
    h = {**api.as_("fin_operator"), **_key("trigger-1")}
    first = api.client.post(TRIGGER, json={"conf": {"limit": 3}}, headers=h)
    assert first.status_code == 201, first.text
    assert "idempotent-replayed" not in first.headers
    again = api.client.post(TRIGGER, json={"conf": {"limit": 3}}, headers=h)
    assert again.status_code == 201
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json()
    assert _runs(api) == 1
    # Without a key, or with another one, each call is a new run.
    assert api.client.post(TRIGGER, json={"conf": {"limit": 3}}, headers=api.as_("fin_operator")).is_success
    assert api.client.post(
        TRIGGER, json={}, headers={**api.as_("fin_operator"), **_key("trigger-2")}
    ).is_success
    assert _runs(api) == 3


def test_a_key_is_the_callers_own(api: Api) -> None:
    key = _key("shared-key")
    mine = api.client.post(TRIGGER, json={}, headers={**api.as_("fin_operator"), **key})
    theirs = api.client.post(TRIGGER, json={}, headers={**api.as_("admin"), **key})
    assert mine.status_code == theirs.status_code == 201
    assert mine.json()["run_id"] != theirs.json()["run_id"]
    assert _runs(api) == 2


def test_a_key_reused_for_a_different_request_is_422_naming_the_conflict(api: Api) -> None:
    h = {**api.as_("admin"), **_key("reused")}
    assert api.client.post(TRIGGER, json={"conf": {"limit": 3}}, headers=h).status_code == 201
    other_body = api.client.post(TRIGGER, json={"conf": {"limit": 4}}, headers=h)
    assert other_body.status_code == 422
    assert other_body.headers["content-type"] == "application/problem+json"
    problem = other_body.json()
    assert problem["title"] == "Idempotency-Key reused"
    assert "'reused'" in problem["detail"] and "different body" in problem["detail"]
    other_dag = api.client.post("/api/v1/dags/fin_broken/runs", json={}, headers=h)
    assert other_dag.status_code == 422
    assert f"for POST {TRIGGER}" in other_dag.json()["detail"]
    assert _runs(api) == 1 and _runs(api, "fin_broken") == 0


def test_a_refused_request_records_nothing_and_its_key_stays_free(api: Api) -> None:
    h = {**api.as_("fin_operator"), **_key("after-refusal")}
    bad = api.client.post(TRIGGER, json={"conf": {"limit": 0}}, headers=h)
    assert bad.status_code == 422 and bad.json()["title"] == "Invalid params"
    assert _keys(api) == []
    with TestClient(
        create_app(api.db, ApiSettings(), secret_key=SECRET, admission=AdmissionLimits(per_dag=1))
    ) as c:
        assert c.post(TRIGGER, json={}, headers=api.as_("fin_operator")).status_code == 201
        refused = c.post(TRIGGER, json={}, headers=h)
        assert refused.status_code == 429
    assert _keys(api) == [] and _runs(api) == 1
    # The key was never bound: the same key now starts its run.
    assert api.client.post(TRIGGER, json={}, headers=h).status_code == 201
    assert _runs(api) == 2 and len(_keys(api)) == 1


def test_concurrent_requests_with_one_key_start_one_run(api: Api) -> None:
    clients = [make_client(api.db) for _ in range(6)]
    h = {**api.as_("fin_operator"), **_key("concurrent")}
    start = threading.Barrier(len(clients))
    answers: list[Any] = []
    lock = threading.Lock()

    def call(client: TestClient) -> None:
        start.wait(timeout=60)
        response = client.post(TRIGGER, json={}, headers=h)
        with lock:
            answers.append(response)

    threads = [threading.Thread(target=call, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for c in clients:
        c.close()
    assert len(answers) == len(clients)
    assert _runs(api) == 1
    created = [a for a in answers if a.status_code == 201]
    waiting = [a for a in answers if a.status_code == 409]
    assert len(created) + len(waiting) == len(clients), [(a.status_code, a.text) for a in answers]
    assert len({a.json()["run_id"] for a in created}) == 1
    assert sum(1 for a in created if "idempotent-replayed" not in a.headers) == 1
    assert all(a.json()["title"] == "Idempotency-Key in use" and "retry-after" in a.headers for a in waiting)
    # Whoever waited gets the run once the first request answered.
    replay = api.client.post(TRIGGER, json={}, headers=h)
    assert replay.status_code == 201 and replay.json()["run_id"] == created[0].json()["run_id"]


def _request(key: str) -> Any:
    """A request with `key` from one token to one route (for the engine-level tests)."""
    return idempotent_request(
        key=key,
        identity="token:1:x",
        route="/x",
        method="POST",
        path="/x",
        body={},
        retention=timedelta(hours=1),
    )


def test_a_claim_commits_with_the_change_and_a_second_claim_cannot(api: Api) -> None:
    """While one request's change is in flight (claim not yet committed), another request with the
    key either waits for it or finds it: it never makes a second change."""
    request = _request("in-flight")
    inside, second_done = threading.Event(), threading.Event()
    outcome: list[object] = []

    def slow_make() -> Any:
        with api.db.begin():
            inside.set()
            # Hold the transaction (with the claim in it) while the second request tries; it
            # blocks on the claim (or SQLite's writer lock), so this wait ends by its timeout.
            second_done.wait(timeout=2)
        return "first"

    def second_make() -> Any:
        with api.db.begin():  # its change: the claim joins this transaction
            pass
        return "second"

    def second() -> None:
        inside.wait(timeout=60)
        try:
            outcome.append(
                idempotency.respond_once(
                    api.db, request, make=second_make, answer=lambda r: (201, {"made": r})
                )
            )
        except IdempotencyKeyInProgress as exc:
            outcome.append(exc)
        finally:
            second_done.set()

    t = threading.Thread(target=second)
    t.start()
    got = idempotency.respond_once(api.db, request, make=slow_make, answer=lambda r: (201, {"made": r}))
    t.join(timeout=60)
    assert got.body == {"made": "first"} and not got.replayed
    (other,) = outcome
    # The second started inside the first's transaction: it met the claim once that committed,
    # and either replayed the first's answer or was told to retry; its own `make` never ran.
    if isinstance(other, idempotency.Response):
        assert other.replayed and other.body == {"made": "first"}
    else:
        assert isinstance(other, IdempotencyKeyInProgress)
    replay = idempotency.respond_once(
        api.db, request, make=lambda: "third", answer=lambda r: (201, {"made": r})
    )
    assert replay.replayed


@dataclass(frozen=True)
class _Made:
    n: int


class _CutOff(BaseException):
    """The request's process ends here (nothing after this line of the request runs)."""


def _made(result: _Made) -> tuple[int, Any]:
    return 201, {"made": result.n}


def test_the_answer_commits_with_the_change_so_a_request_cut_off_after_its_commit_replays(api: Api) -> None:
    """A transaction that returns the response's value records the answer with the change: a
    request cut off right after its commit leaves a key whose retries replay the answer instead
    of being told to wait until the key expires."""
    request = _request("cut-off")

    def make() -> _Made:
        api.db.transact(lambda conn: _Made(1))
        raise _CutOff

    with pytest.raises(_CutOff):
        idempotency.respond_once(api.db, request, make=make, answer=_made, result_type=_Made)
    replay = idempotency.respond_once(api.db, request, make=lambda: _Made(2), answer=_made, result_type=_Made)
    assert replay.replayed and replay.body == {"made": 1}


def test_an_answer_recorded_with_the_change_is_corrected_when_the_use_case_returns_another(api: Api) -> None:
    """The answer recorded in the change's transaction is the transaction's value; a use case
    that returns something else afterwards has its own answer recorded over it."""
    request = _request("corrected")

    def make() -> _Made:
        first = api.db.transact(lambda conn: _Made(1))
        return _Made(first.n + 4)

    got = idempotency.respond_once(api.db, request, make=make, answer=_made, result_type=_Made)
    assert got.body == {"made": 5} and not got.replayed
    replay = idempotency.respond_once(api.db, request, make=lambda: _Made(9), answer=_made, result_type=_Made)
    assert replay.replayed and replay.body == {"made": 5}


def test_an_expired_key_is_free_again_and_pruned(api: Api) -> None:
    h = {**api.as_("fin_operator"), **_key("expiring")}
    assert api.client.post(TRIGGER, json={"conf": {"limit": 3}}, headers=h).status_code == 201
    past = datetime.now(UTC) - timedelta(minutes=1)
    with api.db.begin() as conn:
        conn.execute(sa.update(idempotency_keys).values(expires_at=past))
    # Expired: the key is free, even for another body.
    again = api.client.post(TRIGGER, json={"conf": {"limit": 4}}, headers=h)
    assert again.status_code == 201 and "idempotent-replayed" not in again.headers
    assert _runs(api) == 2
    with api.db.begin() as conn:
        conn.execute(sa.update(idempotency_keys).values(expires_at=past))
    assert idempotency.prune_expired(api.db) == 1
    assert _keys(api) == []


def test_the_retention_prune_deletes_expired_keys(api: Api) -> None:
    from treadle.engine.retention import prune

    h = {**api.as_("fin_operator"), **_key("old")}
    assert api.client.post(TRIGGER, json={}, headers=h).status_code == 201
    assert prune(api.db, older_than=timedelta(days=1)).rows.idempotency_keys == 0
    with api.db.begin() as conn:
        conn.execute(sa.update(idempotency_keys).values(expires_at=datetime.now(UTC) - timedelta(seconds=1)))
    dry = prune(api.db, older_than=timedelta(days=1), dry_run=True)
    assert dry.rows.idempotency_keys == 1
    assert prune(api.db, older_than=timedelta(days=1)).rows.idempotency_keys == 1
    assert _keys(api) == []


def test_a_retried_backfill_is_recorded_once(api: Api) -> None:
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    body = {
        "from_date": (now - timedelta(days=3)).isoformat(),
        "to_date": (now - timedelta(days=1)).isoformat(),
        "reason": "reload",
    }
    h = {**api.as_("admin"), **_key("backfill-1")}
    first = api.client.post("/api/v1/dags/ops_daily/backfills", json=body, headers=h)
    assert first.status_code == 201, first.text
    again = api.client.post("/api/v1/dags/ops_daily/backfills", json=body, headers=h)
    assert again.status_code == 201 and again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"
    with api.db.read() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(backfills)).scalar_one() == 1


def test_a_retried_requeue_gets_its_answer_once_the_instance_moved_on(api: Api, api_db_url: str) -> None:
    runner = DagRunner(fin_broken, database_url=api_db_url)
    runner.run_until_done(runner.trigger())
    h = {**api.as_("fin_operator"), **_key("requeue-1")}
    ti = api.client.get("/api/v1/dead-letters", headers=h).json()[0]["task_instance"]["id"]
    first = api.client.post(f"/api/v1/dead-letters/{ti}/requeue", headers=h)
    assert first.status_code == 200 and first.json()["state"] == "queued"
    again = api.client.post(f"/api/v1/dead-letters/{ti}/requeue", headers=h)
    assert again.status_code == 200 and again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"
    # Without the key the instance is no dead letter any more.
    assert (
        api.client.post(f"/api/v1/dead-letters/{ti}/requeue", headers=api.as_("fin_operator")).status_code
        == 404
    )
    from treadle.engine import accounts

    assert len(accounts.list_audit(api.db, action="dead_letter.requeue")) == 1
    runner.close()


@pytest.mark.parametrize("value", ["", "has space", "x" * 256, "naïve"])
def test_a_malformed_key_is_422_naming_the_header(api: Api, value: str) -> None:
    response = api.client.post(
        TRIGGER,
        json={},
        headers={
            **{k.encode(): v.encode() for k, v in api.as_("fin_operator").items()},
            b"Idempotency-Key": value.encode(),
        },
    )
    assert response.status_code == 422, response.text
    assert "Idempotency-Key" in response.json()["detail"]
    assert _runs(api) == 0


def test_the_openapi_document_names_the_header(api: Api) -> None:
    doc = api.client.get("/api/v1/openapi.json").json()
    for path in (
        "/api/v1/dags/{dag_id}/runs",
        "/api/v1/dags/{dag_id}/backfills",
        "/api/v1/dead-letters/{task_instance_id}/requeue",
    ):
        names = [p["name"] for p in doc["paths"][path]["post"].get("parameters", [])]
        assert "Idempotency-Key" in names, path
        assert "409" in doc["paths"][path]["post"]["responses"]


def test_the_run_engine_path_still_triggers_without_a_key(api: Api) -> None:
    run = trigger_run(api.db, "fin_report", triggered_by="test")
    assert run.dag_id == "fin_report" and _keys(api) == []
