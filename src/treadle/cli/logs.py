"""`treadle logs`: print (or follow) the log of one attempt, from this host's logs folder."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path
from typing import BinaryIO

import click

from treadle.cli.main import Context, cli, pass_context
from treadle.engine.attempt_logs import AttemptLocation, is_running, locate_attempt
from treadle.errors import AttemptLogMissing

#: How often --follow reads new output and asks the database whether the attempt still runs.
FOLLOW_POLL_S = 0.5
#: Bytes copied at a time.
CHUNK = 64 * 1024


@cli.command("logs")
@click.argument("run_id")
@click.argument("task_id")
@click.option(
    "--attempt", type=click.IntRange(min=1), default=None, help="Attempt number (default: the latest)."
)
@click.option("--map-index", type=int, default=-1, show_default=True, help="Map index of a mapped task.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing a running attempt's output until it ends.")
@pass_context
def logs_cmd(
    ctx: Context, run_id: str, task_id: str, attempt: int | None, map_index: int, follow: bool
) -> None:
    """Print the stdout and stderr of one attempt of a task.

    Logs are kept on the host of the worker that ran the attempt, under TREADLE_LOGS_FOLDER
    (default $TREADLE_HOME/logs); run this there.
    """
    location = locate_attempt(ctx.db, run_id, task_id, attempt=attempt, map_index=map_index)
    path = location.log_path(ctx.settings.logs_dir)
    out = sys.stdout.buffer
    if not (follow and location.running):
        _print_whole(path, location, out)
        return
    _follow(ctx, path, location, out)


def _print_whole(path: Path, location: AttemptLocation, out: BinaryIO) -> None:
    try:
        with path.open("rb") as log:
            while chunk := log.read(CHUNK):
                out.write(chunk)
    except FileNotFoundError:
        raise _missing(path, location) from None
    out.flush()


def _follow(ctx: Context, path: Path, location: AttemptLocation, out: BinaryIO) -> None:
    """Print what the attempt writes until it ends (its state in the database says so), then
    the rest of the file. The file may appear only once the attempt starts."""
    log: BinaryIO | None = None
    try:
        while True:
            running = is_running(ctx.db, location)
            if log is None:
                try:
                    log = path.open("rb")
                except FileNotFoundError:
                    if not running:
                        raise _missing(path, location) from None
            if log is not None:
                while chunk := log.read(CHUNK):
                    out.write(chunk)
                out.flush()
            if not running:
                return
            time.sleep(FOLLOW_POLL_S)
    finally:
        if log is not None:
            log.close()


def _missing(path: Path, location: AttemptLocation) -> AttemptLogMissing:
    here = socket.gethostname()
    what = f"attempt {location.attempt} of task {location.task_id!r} in run {location.run_id!r}"
    if location.hostname and location.hostname != here:
        message = (
            f"no log of {what} on this host ({here}): it ran on {location.hostname}, and logs stay on "
            f"the host of the worker that ran the attempt; run `treadle logs` there (looked for {path})"
        )
    else:
        ran = f"it ran on this host ({here})" if location.hostname else "its host is not recorded"
        message = (
            f"no log of {what} at {path} ({ran}): the attempt wrote none (it never started), "
            "retention removed it, or its worker keeps logs elsewhere (TREADLE_LOGS_FOLDER)"
        )
    return AttemptLogMissing(message, path=str(path), hostname=location.hostname)
