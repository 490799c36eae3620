"""An external Java job run as a command task under the standard exit-code contract.

`snapshot` runs examples/jobs/snapshot/Snapshot.java: it reads the run manifest
(`--run-manifest FILE`), stages a CSV and writes run-output.json, metrics.json and lineage.json
into TREADLE_OUTPUT_DIR, and exits as the run's `scenario` param says: 0 (`ok`), 20
(`not_ready`: retried), 30 (`bad_input`: dead-lettered at once) or 60 (`commit_unknown`: the
task waits in needs_inspection for `treadle tasks resolve`). `publish` receives the job's
run-output.json as its argument. `treadle logs RUN_ID snapshot` prints what the job wrote.

The job runs compiled from the folder in SNAPSHOT_JOB_CLASSPATH, or from
examples/jobs/snapshot/classes (`javac -d examples/jobs/snapshot/classes
examples/jobs/snapshot/Snapshot.java`), or else from its source (`java Snapshot.java`, JDK 11+).
A worker without java fails the task at once, saying so.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from treadle import NonRetryable, Param, dag, task

JOB_DIR = Path(__file__).resolve().parents[1] / "jobs" / "snapshot"


@task.command(exit_codes="standard", retries=2, retry_delay=5, timeout=300)
def snapshot() -> list[str]:
    """The java command line of the snapshot job (treadle appends --run-manifest FILE)."""
    java = shutil.which("java")
    if java is None:
        raise NonRetryable(
            "java is not installed on this worker: the snapshot job needs a JDK 17 "
            "(e.g. apt-get install openjdk-17-jdk-headless)",
            exit_code=10,
        )
    classes = Path(os.environ.get("SNAPSHOT_JOB_CLASSPATH") or JOB_DIR / "classes")
    if (classes / "Snapshot.class").is_file():
        return [java, "-cp", str(classes), "Snapshot"]
    return [java, str(JOB_DIR / "Snapshot.java")]


@task
def publish(staged: dict[str, Any]) -> str:
    """Announce the staged snapshot (the job's run-output.json)."""
    return f"snapshot of {staged['rows']} rows staged at {staged['staging']}"


@dag(
    dag_id="snapshot_job",
    owner="warehouse",
    tags=["example", "java"],
    params={
        "scenario": Param(
            "ok",
            enum=["ok", "not_ready", "bad_input", "commit_unknown"],
            description="how the job ends",
        )
    },
)
def snapshot_job() -> None:
    publish(snapshot())
