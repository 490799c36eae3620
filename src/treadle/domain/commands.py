"""Command tasks: what a command is, where its files go on the worker's host, and the allow-list.

Pure rules only: paths are computed from the settings' folders and ids, never created here.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Files a command may leave in its output folder, stored with its attempt (by name, without
#: ".json"), each at most MAX_OUTPUT_FILE_BYTES.
ATTEMPT_OUTPUT_FILES = ("metrics.json", "lineage.json", "sink-commit.json", "error-report.json")
#: The file whose JSON becomes the task's result (subject to TREADLE_MAX_RESULT_BYTES).
RESULT_FILE = "run-output.json"
#: Largest output file stored with an attempt.
MAX_OUTPUT_FILE_BYTES = 64 * 1024
#: How much of the end of a command's stderr goes into the recorded error message.
STDERR_TAIL_BYTES = 2048
#: The argument (followed by the manifest's path) appended to a command's argv.
MANIFEST_ARG = "--run-manifest"
#: Name of the run manifest file in the run's folder.
MANIFEST_FILE = "manifest.json"
#: The setting the allow-list comes from (named in refusals).
ALLOWLIST_VARIABLE = "TREADLE_COMMAND_ALLOWLIST"
#: Program a `shell=True` command runs (it is what the allow-list checks).
SHELL = "/bin/sh"

#: Any: JSON values as stored.
JSON = Any


@dataclass(frozen=True, slots=True, kw_only=True)
class CommandSpec:
    """How a command task runs its program.

    `argv` is fixed for a `CommandTask`; None for `@task.command`, whose function returns it.
    """

    argv: tuple[str, ...] | str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    #: Narrows TREADLE_COMMAND_ALLOWLIST for this task (None: the setting alone decides).
    allowed: tuple[str, ...] | None = None
    #: Run argv (then a single string) through /bin/sh.
    shell: bool = False
    #: Append `--run-manifest FILE` to argv.
    manifest_arg: bool = True

    def to_json(self) -> dict[str, JSON]:
        """The JSON form kept in the DAG version, so an edited command is a new version. The
        environment's values are represented by a hash: they may hold credentials."""
        env_text = "\n".join(f"{k}={v}" for k, v in sorted(self.env.items()))
        return {
            "argv": self.argv if self.argv is None or isinstance(self.argv, str) else list(self.argv),
            "env_keys": sorted(self.env),
            "env_sha256": hashlib.sha256(env_text.encode()).hexdigest(),
            "cwd": self.cwd,
            "allowed": None if self.allowed is None else list(self.allowed),
            "shell": self.shell,
            "manifest_arg": self.manifest_arg,
        }


def trace_id(run_id: str) -> str:
    """The correlation id of a run (32 hex digits, the W3C trace-id form): the same for every
    attempt of every task of the run, so a job's own logs and spans can be joined to it."""
    return hashlib.sha256(f"treadle-run:{run_id}".encode()).hexdigest()[:32]


def _part(kind: str, value: str) -> str:
    # Ids match [A-Za-z0-9._-]{1,250}, which still lets "." and ".." through.
    if value in {".", ".."} or "/" in value or not value:
        raise ValueError(f"{kind} {value!r} cannot name a folder")
    return value


def instance_folder_name(task_id: str, map_index: int) -> str:
    """`task_id`, or `task_id.N` for element N of a mapped task."""
    name = _part("task id", task_id)
    return name if map_index < 0 else f"{name}.{map_index}"


def run_folder(runs_dir: Path, run_id: str) -> Path:
    """Where a run's files live on a worker's host (its manifest, its command outputs)."""
    return runs_dir / _part("run id", run_id)


def output_folder(runs_dir: Path, *, run_id: str, task_id: str, map_index: int, attempt: int) -> Path:
    """TREADLE_OUTPUT_DIR of one attempt of a command task: RUNS/<run_id>/outputs/<task>/<attempt>
    (beside the run's manifest and its `artifacts/`)."""
    return run_folder(runs_dir, run_id) / "outputs" / instance_folder_name(task_id, map_index) / str(attempt)


def attempt_log_path(
    logs_dir: Path, *, dag_id: str, run_id: str, task_id: str, map_index: int, attempt: int
) -> Path:
    """The log file of one attempt: LOGS/<dag_id>/<run_id>/<task_id>[.<map_index>]/<attempt>.log."""
    return (
        logs_dir
        / _part("dag id", dag_id)
        / _part("run id", run_id)
        / instance_folder_name(task_id, map_index)
        / f"{attempt}.log"
    )


def program_allowed(program: str, resolved: str | None, patterns: Sequence[str]) -> bool:
    """True if `program` (argv[0], resolved to an absolute path where found) matches a pattern.

    A pattern with a "/" matches the absolute path (`/usr/bin/*`, `/opt/jdk-*/bin/java`); one
    without matches the program's file name (`java`, `python3*`). An empty list allows anything.
    """
    if not patterns:
        return True
    path = resolved or program
    name = os.path.basename(program)
    for pattern in patterns:
        if "/" in pattern:
            if fnmatch.fnmatchcase(path, pattern) or fnmatch.fnmatchcase(program, pattern):
                return True
        elif fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(os.path.basename(path), pattern):
            return True
    return False


def parse_allowlist(raw: str) -> tuple[str, ...]:
    """Split a TREADLE_COMMAND_ALLOWLIST value: patterns separated by commas or newlines."""
    return tuple(p.strip() for p in raw.replace("\n", ",").split(",") if p.strip())


def tail(data: bytes, limit: int = STDERR_TAIL_BYTES) -> str:
    """The last `limit` bytes of `data` as text (an invalid sequence cut at the start is replaced)."""
    return data[-limit:].decode(errors="replace")
