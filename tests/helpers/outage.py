"""Shared by the database outage tests: a DAG of many short tasks that note when each attempt
starts and ends (one O_APPEND line each), and the reading of those notes."""

from __future__ import annotations

import time
from pathlib import Path

EFFECT_DAG = """
    from __future__ import annotations

    import os
    import random
    import time

    from treadle import TaskContext, dag, task

    EFFECTS = __EFFECTS__


    def note(what: str, context: TaskContext) -> None:
        fd = os.open(EFFECTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, f"{what} {context.task_id} {context.attempt}\\n".encode())
        os.close(fd)


    def work(context: TaskContext) -> int:
        note("start", context)
        time.sleep(random.uniform(0.05, 0.4))
        note("end", context)
        return context.attempt


    @dag(dag_id="outage")
    def outage() -> None:
        for n in range(__TASKS__):
            task(task_id=f"t{n}", retries=3, retry_delay=0)(work)()
"""


def read_effects(path: Path) -> list[tuple[str, str, int]]:
    """The notes so far: (start|end, task id, attempt number), in the order they were written."""
    lines = path.read_text().splitlines() if path.exists() else []
    return [(what, task_id, int(attempt)) for what, task_id, attempt in (line.split() for line in lines)]


def ended(path: Path) -> int:
    """How many attempts have ended so far."""
    return sum(what == "end" for what, _, _ in read_effects(path))


def wait_out(seconds: float) -> float:
    """Let an outage last `seconds` (the one fixed wait of these tests is the fault being
    injected); returns the seconds it took."""
    began = time.monotonic()
    time.sleep(seconds)
    return time.monotonic() - began
