"""The regulatory daily snapshot: source readiness sensor -> Java job -> quality gate -> atomic
publish -> dataset event.

1. `deliver_extract` stands in for the upstream system: it writes the day's extract into the inbox
   (a header, one row per region, a trailer ``TRAILER|n``). Set the param `simulate_source` to
   false and the inbox is left to the real producer.
2. `source_ready` is a file sensor: it waits, holding no worker slot, until the extract exists,
   its size is stable across two pokes and the trailer announces as many rows as the file holds;
   its evidence (path, size, sha256, rows, trailer count) is stored with the attempt.
3. `snapshot` runs the Java job in examples/jobs/snapshot under the standard exit-code contract
   (`--source FILE --run-manifest FILE`): it stages the rows and writes run-output.json. Exit 20
   is retried, 30 dead-letters at once, 60 waits in needs_inspection for `treadle tasks resolve`.
4. `check_snapshot` is a quality gate: BLOCKER when the staged rows differ from the source's
   trailer count or a total is negative; WARN when a region's total is zero.
5. `publish` copies the staged file to an immutable version, swaps the `CURRENT` pointer atomically
   and records the dataset event `regulatory.daily_snapshot` with its quality state. A failed
   BLOCKER means `publish` never runs and consumers are not triggered.

Try it: `treadle dags trigger regulatory_snapshot` (green);
`--conf '{"negative_region": true}'` (the gate blocks the publish);
`--conf '{"scenario": "commit_unknown"}'` (needs_inspection; `treadle why RUN_ID` says what to do).
The job runs compiled from SNAPSHOT_JOB_CLASSPATH or examples/jobs/snapshot/classes when present,
else from its source with `java Snapshot.java` (JDK 11+).
"""

from __future__ import annotations

import csv
import os
import shutil
from pathlib import Path
from typing import Any

from treadle import Check, Dataset, NonRetryable, Param, TaskContext, dag, quality_gate, task
from treadle.sensors import file_sensor

JOB_DIR = Path(__file__).resolve().parents[1] / "jobs" / "snapshot"
SNAPSHOT = Dataset("regulatory.daily_snapshot")
REGIONS = {"north": 120.5, "south": 98.0, "west": 43.25, "east": 61.0}


def _home() -> Path:
    return Path(os.environ.get("TREADLE_HOME", "~/.treadle")).expanduser() / "regulatory"


@task(retries=2, retry_delay=1)
def deliver_extract(context: TaskContext) -> str:
    """The inbox path of the day's extract; writes it when `simulate_source` is set."""
    day = context.logical_date.date().isoformat()
    path = _home() / "inbox" / f"sales_{day}_{context.run_id}.csv"
    if context.params["simulate_source"]:
        path.parent.mkdir(parents=True, exist_ok=True)
        totals = dict(REGIONS)
        if context.params["negative_region"]:
            totals["west"] = -5.0
        lines = ["region,total", *(f"{region},{total}" for region, total in totals.items())]
        tmp = path.with_name(f".{path.name}.part")
        tmp.write_text("\n".join([*lines, f"TRAILER|{len(totals)}"]) + "\n")
        os.replace(tmp, path)
    return str(path)


@task.command(exit_codes="standard", retries=2, retry_delay=5, timeout=600)
def snapshot(ready: dict[str, Any]) -> list[str]:
    """The java command line (treadle appends --run-manifest FILE)."""
    java = shutil.which("java")
    if java is None:
        raise NonRetryable(
            "java is not installed on this worker: the snapshot job needs a JDK 17 "
            "(e.g. apt-get install openjdk-17-jdk-headless)",
            exit_code=10,
        )
    classes = Path(os.environ.get("SNAPSHOT_JOB_CLASSPATH") or JOB_DIR / "classes")
    program = [java, "-cp", str(classes), "Snapshot"]
    if not (classes / "Snapshot.class").is_file():
        program = [java, str(JOB_DIR / "Snapshot.java")]
    return [*program, "--source", ready["path"]]


@quality_gate(outlets=[Dataset("regulatory.daily_snapshot_checked")])
def check_snapshot(staged: dict[str, Any], ready: dict[str, Any]) -> list[Check]:
    """BLOCKER: staged rows match the trailer; no negative total. WARN: no region at zero."""
    with Path(staged["staging"]).open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    negative = sorted(r["region"] for r in rows if float(r["total"]) < 0)
    zero = sorted(r["region"] for r in rows if float(r["total"]) == 0)
    return [
        Check("rows_match_trailer", passed=len(rows) == ready["trailer_count"], observed=len(rows),
              expected=ready["trailer_count"]),
        Check("no_negative_totals", passed=not negative, observed=negative, expected=[]),
        Check("no_zero_totals", passed=not zero, severity="WARN", observed=zero, expected=[]),
    ]  # fmt: skip


@task(retries=2, retry_delay=1, outlets=[SNAPSHOT])
def publish(staged: dict[str, Any], quality: dict[str, Any], context: TaskContext) -> dict[str, Any]:
    """Copy the staged file to an immutable version, then swap the CURRENT pointer atomically."""
    versions = _home() / "versions"
    versions.mkdir(parents=True, exist_ok=True)
    version = versions / f"{context.run_id}.csv"
    shutil.copyfile(staged["staging"], version)
    pointer = _home() / "CURRENT"
    tmp = pointer.with_name(f".CURRENT.{os.getpid()}")
    tmp.write_text(str(version))
    os.replace(tmp, pointer)  # atomic on POSIX: readers see the old version or the new one
    context.outlet_event(SNAPSHOT.name, version=context.run_id, metadata={"quality": quality["state"]})
    return {"current": str(version), "rows": staged["rows"], "quality": quality["state"]}


@dag(
    dag_id="regulatory_snapshot",
    owner="regulatory-reporting",
    tags=["example", "java", "quality"],
    purpose="Daily sales snapshot filed with the regulator.",
    criticality="high",
    outlets=[SNAPSHOT],
    freshness_slo="26h",
    failure_impact="The regulator's daily filing is late; the dashboard shows yesterday's figures.",
    params={
        "scenario": Param(
            "ok", enum=["ok", "not_ready", "bad_input", "commit_unknown"], description="how the Java job ends"
        ),
        "simulate_source": Param(True, type="boolean", description="write the extract into the inbox"),
        "negative_region": Param(False, type="boolean", description="make one region's total negative"),
    },
)
def regulatory_snapshot() -> None:
    ready = file_sensor(
        deliver_extract(),
        trailer_prefix="TRAILER|",
        header_lines=1,
        poke_interval=1,
        timeout=6 * 3600,
        task_id="source_ready",
    )
    staged = snapshot(ready)
    publish(staged, check_snapshot(staged, ready))
