"""End-to-end workloads measured as a user sees them: trigger -> run success, wall time.

Each workload exists as a treadle DAG and, where it maps, as the same Celery canvas, so one run
of `treadle bench --vs-celery` measures both on the same machine, interleaved repetition by
repetition (never at the same time).
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """One shape of work: its DAG source for treadle and, if it maps, its Celery canvas."""

    name: str
    #: The name `--only` takes (the full name works too).
    short: str
    dag_id: str
    tasks: int
    description: str
    #: Python source of a DAG file defining `dag_id`.
    dag_source: str
    #: The value the run's last task returns (checked, so a wrong run is not counted).
    expected: int | None
    #: Builds the Celery canvas from the module of Celery tasks (None: no Celery equivalent).
    celery: Callable[[Any], Any] | None = None
    #: Measured once per bench (large), not repeated.
    once: bool = False


def chain_dag(dag_id: str, length: int) -> str:
    """A DAG whose tasks each take the previous task's result (a chain of `length`)."""
    return textwrap.dedent(
        f"""\
        from __future__ import annotations

        from treadle import dag, task


        @task
        def step(n: int) -> int:
            return n + 1


        @dag(dag_id="{dag_id}")
        def {dag_id}() -> None:
            value = step(0)
            for _ in range({length} - 1):
                value = step(value)
        """
    )


def fanout_dag(dag_id: str, width: int) -> str:
    """start -> `width` no-ops (each takes start's result) -> join(all their results)."""
    return textwrap.dedent(
        f"""\
        from __future__ import annotations

        from treadle import dag, task


        @task
        def start() -> int:
            return 1


        @task
        def noop(value: int) -> int:
            return value


        @task
        def join(*values: int) -> int:
            return sum(values)


        @dag(dag_id="{dag_id}")
        def {dag_id}() -> None:
            first = start()
            join(*[noop(first) for _ in range({width})])
        """
    )


def independent_dag(dag_id: str, count: int) -> str:
    """A DAG of `count` independent no-op tasks."""
    return textwrap.dedent(
        f"""\
        from __future__ import annotations

        from treadle import dag, task


        @task
        def noop() -> None:
            return None


        @dag(dag_id="{dag_id}")
        def {dag_id}() -> None:
            for _ in range({count}):
                noop()
        """
    )


def _celery_chain(length: int) -> Callable[[Any], Any]:
    def build(tasks: Any) -> Any:
        from celery import chain

        return chain(tasks.step.s(0), *[tasks.step.s() for _ in range(length - 1)])

    return build


def _celery_fanout(width: int) -> Callable[[Any], Any]:
    def build(tasks: Any) -> Any:
        from celery import chain, chord, group

        return chain(tasks.start.s(), chord(group(tasks.noop.s() for _ in range(width)), tasks.join.s()))

    return build


def _celery_independent(count: int) -> Callable[[Any], Any]:
    def build(tasks: Any) -> Any:
        from celery import group

        return group(tasks.nothing.s() for _ in range(count))

    return build


def workloads(
    *, chain: int = 100, width: int = 500, independent: int = 2000, big: int = 10_000, huge: int = 100_000
) -> list[Workload]:
    """The run workloads of `treadle bench`, in the order they are measured."""
    return [
        Workload(
            name=f"chain-{chain}",
            short="chain",
            dag_id="bench_chain",
            tasks=chain,
            description=f"a chain of {chain} tasks, each taking the previous one's result",
            dag_source=chain_dag("bench_chain", chain),
            expected=chain,
            celery=_celery_chain(chain),
        ),
        Workload(
            name=f"fanout-{width}",
            short="fanout",
            dag_id="bench_fanout",
            tasks=width + 2,
            description=f"1 -> {width} -> 1: a start task, {width} tasks taking its result, a join",
            dag_source=fanout_dag("bench_fanout", width),
            expected=width,
            celery=_celery_fanout(width),
        ),
        Workload(
            name=f"independent-{independent}",
            short="independent",
            dag_id="bench_independent",
            tasks=independent,
            description=f"{independent} independent no-op tasks in one run",
            dag_source=independent_dag("bench_independent", independent),
            expected=None,
            celery=_celery_independent(independent),
        ),
        Workload(
            name=f"run-{big}",
            short="run",
            dag_id="bench_big",
            tasks=big,
            description=f"one run of {big} independent no-op tasks (time, scheduler CPU, peak memory)",
            dag_source=independent_dag("bench_big", big),
            expected=None,
            once=True,
        ),
        Workload(
            name=f"run-{huge}",
            short="huge",
            dag_id="bench_huge",
            tasks=huge,
            description=f"one run of {huge} independent no-op tasks: creation, rate, cost per task",
            dag_source=independent_dag("bench_huge", huge),
            expected=None,
            once=True,
        ),
    ]


#: The Celery side's task module (written next to the Celery workers).
CELERY_APP = """\
from __future__ import annotations

import os

from celery import Celery

app = Celery("treadle_bench", broker=os.environ["BENCH_REDIS"], backend=os.environ["BENCH_REDIS"])
app.conf.update(
    task_default_queue=os.environ["BENCH_QUEUE"],
    result_expires=600,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)


@app.task
def step(n: int) -> int:
    return n + 1


@app.task
def start() -> int:
    return 1


@app.task
def noop(value: int) -> int:
    return value


@app.task
def nothing() -> None:
    return None


@app.task
def join(values: list[int]) -> int:
    return sum(values)
"""
