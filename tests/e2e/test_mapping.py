"""Dynamic task mapping with real processes: a scheduler and workers expand, run and reduce a
300-element mapping; a 2,000-element one is refused by the default cap; max_active_mapped holds
the number of instances running at once."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.e2e.conftest import Cluster

pytestmark = [pytest.mark.e2e]

DAGS = """
    from __future__ import annotations

    import os
    import time

    from treadle import TaskContext, dag, task

    SPANS = __SPANS__


    @task
    def discover(n: int) -> list[int]:
        return list(range(n))


    @task
    def square(item: int, offset: int, context: TaskContext) -> int:
        assert context.map_index == item
        return item * item + offset


    @task
    def reduce(values: list[int]) -> dict[str, object]:
        return {"count": len(values), "values": values}


    @dag(dag_id="map_300")
    def map_300() -> None:
        reduce(square.partial(offset=1).expand(item=discover(300)))


    @dag(dag_id="map_2000")
    def map_2000() -> None:
        reduce(square.partial(offset=1).expand(item=discover(2000)))


    @task(max_active_mapped=3)
    def slow(item: int) -> int:
        start = time.time()
        time.sleep(0.3)
        fd = os.open(SPANS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, f"{item} {start} {time.time()}\\n".encode())
        os.close(fd)
        return item


    @dag(dag_id="paced")
    def paced() -> None:
        reduce(slow.expand(item=discover(12)))
"""

DATABASES = ["sqlite_url", pytest.param("pg_url", marks=pytest.mark.postgres)]


def _cluster(request: pytest.FixtureRequest, cluster: Callable[..., Cluster], fixture: str) -> Cluster:
    c = cluster(request.getfixturevalue(fixture))
    c.write_dag("mapping.py", DAGS, spans=str(c.root / "spans.log"))
    assert c.cli("dags", "sync").returncode == 0
    c.start("scheduler", "scheduler")
    c.start("w1", "worker", "--concurrency", "4")
    c.start("w2", "worker", "--concurrency", "4")
    return c


@pytest.mark.parametrize("fixture", DATABASES)
def test_a_300_element_mapping_reduces_in_order_and_2000_elements_hit_the_cap(
    request: pytest.FixtureRequest, cluster: Callable[..., Cluster], fixture: str
) -> None:
    c = _cluster(request, cluster, fixture)

    run_id = c.trigger("map_300")
    detail = c.wait_run(run_id, timeout=300)
    assert detail.run.state == "success", c.logs_tail()
    assert detail.results["reduce"] == {"count": 300, "values": [i * i + 1 for i in range(300)]}
    mapped = sorted(t.map_index for t in detail.task_instances if t.task_id == "square")
    assert mapped == list(range(300))
    assert {t.state for t in detail.task_instances} == {"success"}
    # Each instance ran once, and the operator's view names it by its map index.
    assert len([a for a in detail.attempts if a.task_id == "square"]) == 300
    shown = c.cli("runs", "show", run_id)
    assert shown.returncode == 0 and "square[299]" in shown.stdout and "square[0]" in shown.stdout

    too_long = c.trigger("map_2000")
    failed = c.wait_run(too_long, timeout=120)
    assert failed.run.state == "failed"
    states = {t.task_id: t.state for t in failed.task_instances}
    assert states == {"discover": "success", "square": "dead_letter", "reduce": "upstream_failed"}
    (attempt,) = [a for a in failed.attempts if a.task_id == "square"]
    assert attempt.error_type == "MapLengthExceeded"
    assert attempt.error_message is not None
    assert "would expand into 2000 instances" in attempt.error_message
    assert "the cap is 1024 (TREADLE_MAX_MAP_LENGTH=1024 (the default))" in attempt.error_message
    letters = c.cli("dead-letters", "list")
    assert (
        letters.returncode == 0
        and "non_retryable" in letters.stdout
        and "MapLengthExceeded" in letters.stdout
    )


@pytest.mark.postgres
def test_max_active_mapped_bounds_the_instances_running_at_once(
    request: pytest.FixtureRequest, cluster: Callable[..., Cluster]
) -> None:
    c = _cluster(request, cluster, "pg_url")

    run_id = c.trigger("paced")
    detail = c.wait_run(run_id, timeout=180)
    assert detail.run.state == "success", c.logs_tail()
    assert detail.results["reduce"] == {"count": 12, "values": list(range(12))}

    spans = [line.split() for line in (c.root / "spans.log").read_text().splitlines()]
    assert sorted(int(item) for item, _, _ in spans) == list(range(12))
    # Eight free slots, twelve 0.3 s instances: without the bound up to eight would overlap.
    events = sorted([(float(start), 1) for _, start, _ in spans] + [(float(end), -1) for _, _, end in spans])
    running, most = 0, 0
    for _, step in events:
        running += step
        most = max(most, running)
    assert 1 <= most <= 3


def test_tasks_test_runs_one_element_of_a_mapped_task(
    sqlite_url: str, cluster: Callable[..., Cluster]
) -> None:
    c = cluster(sqlite_url)
    c.write_dag("mapping.py", DAGS, spans=str(c.root / "spans.log"))
    # square checks that its context.map_index is its item, and adds its partial offset.
    done = c.cli("tasks", "test", "map_300", "square", "--upstream", "discover=[0, 1, 2]", "--map-index", "2")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "5"
    done = c.cli("tasks", "test", "paced", "slow", "--upstream", "discover=[5, 6, 7]", "--map-index", "1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "6"
    past = c.cli("tasks", "test", "paced", "slow", "--upstream", "discover=[5]", "--map-index", "1")
    assert past.returncode != 0 and "--map-index 1 is past the end of the list (1 elements)" in past.stderr
