"""Submit-then-poll: a detached job that runs outside the worker.

`rebuild` starts a local process (`LocalProcessJob`) in its own session and returns at once; the
task then waits in the database (`up_for_reschedule`) and a worker polls the job's exit file every
second, holding no slot in between. A worker that dies between polls loses nothing: the next one
polls the same job. Cancelling the run (`treadle runs cancel RUN_ID`) stops the process. The job's
exit code is classified by the standard contract: `--conf '{"exit_code": 60}'` puts the task in
needs_inspection, `20` retries it, `30` dead-letters it.

Try it: `treadle dags trigger detached_rebuild --conf '{"seconds": 5}'`, then `treadle why RUN_ID`
while it runs.
"""

from __future__ import annotations

import sys
from typing import Any

from treadle import Param, dag, task
from treadle.jobs import LocalProcessJob

# The job reads its run's params from the manifest (TREADLE_MANIFEST_FILE), prints progress,
# and exits with the requested code.
JOB = """
import json, os, sys, time
params = json.load(open(os.environ["TREADLE_MANIFEST_FILE"]))["params"]
for step in range(int(float(params["seconds"]) * 2)):
    print(f"rebuilding: step {step + 1}", flush=True)
    time.sleep(0.5)
sys.exit(int(params["exit_code"]))
"""


@task
def announce(finished: dict[str, Any]) -> str:
    """Runs once the detached job succeeded."""
    return f"rebuild finished with exit code {finished['exit_code']} (job folder {finished['dir']})"


@dag(
    dag_id="detached_rebuild",
    owner="data-platform",
    tags=["example", "deferred"],
    description="Submit a detached job, poll it without holding a slot, then announce.",
    params={
        "seconds": Param(3, type="number", minimum=0, maximum=3600, description="how long the job runs"),
        "exit_code": Param(0, type="integer", minimum=0, maximum=255, description="how the job ends"),
    },
)
def detached_rebuild() -> None:
    rebuild = LocalProcessJob(
        [sys.executable, "-c", JOB],
        task_id="rebuild",
        poll_interval=1,
        timeout=3600,
        exit_codes="standard",
        retries=1,
    )
    announce(rebuild)
