"""GET /metrics: guarded like any route unless TREADLE_API_METRICS_PUBLIC makes it public."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tests.api.conftest import Api, make_client
from treadle.api.settings import ApiSettings
from treadle.engine.runs import trigger_run


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_metrics_need_a_global_viewer_and_show_the_queue(api: Api) -> None:
    assert api.client.get("/metrics").status_code == 401
    # A team's viewer may not see every team's DAG ids in the labels.
    assert api.client.get("/metrics", headers=api.as_("fin_viewer")).status_code == 403
    before = api.client.get("/metrics", headers=api.as_("admin"))
    assert before.status_code == 200 and before.headers["content-type"].startswith("text/plain")
    trigger_run(api.db, "ops_daily", triggered_by="test")
    after = _samples(api.client.get("/metrics", headers=api.as_("admin")).text)
    assert after[("treadle_database_up", ())] == 1
    assert after[("treadle_queue_depth", (("queue", "default"),))] >= 1
    # The API's own database calls are timed (the guard's token lookups at least).
    assert after[("treadle_database_call_seconds_count", (("kind", "write"),))] >= 1


def test_public_metrics_are_exempt_from_credentials_at_the_exact_path_only(api: Api) -> None:
    assert ApiSettings.from_env({"TREADLE_API_METRICS_PUBLIC": "true"}).metrics_public
    with make_client(api.db, metrics_public=True) as client:
        response = client.get("/metrics")
        assert response.status_code == 200
        assert ("treadle_database_up", ()) in _samples(response.text)
        assert client.get("/metrics/").status_code == 401
        assert client.get("/api/v1/dags").status_code == 401
