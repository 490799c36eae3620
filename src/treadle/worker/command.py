"""Run a command task's program in the task process: allow-list, environment, output capture,
exit-code classification, structured outputs.

The program stays in the task process's group (the child called setsid), so the worker's kill of
that group on timeout, revocation or its own death ends the program and everything it started.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from treadle.authoring.commands import check_argv
from treadle.domain.commands import (
    ALLOWLIST_VARIABLE,
    ATTEMPT_OUTPUT_FILES,
    MANIFEST_ARG,
    MANIFEST_FILE,
    MAX_OUTPUT_FILE_BYTES,
    RESULT_FILE,
    SHELL,
    STDERR_TAIL_BYTES,
    CommandSpec,
    output_folder,
    program_allowed,
    run_folder,
    tail,
    trace_id,
)
from treadle.domain.exit_codes import Disposition, ExitContract
from treadle.errors import DagDefinitionError
from treadle.worker.attempt_log import DRAIN_S, AttemptLog, pump
from treadle.worker.containment import kill_stray_processes
from treadle.worker.protocol import Message

#: Exit code recorded when the program cannot be found or started (as a shell reports it).
NOT_FOUND_EXIT_CODE = 127


class CommandRefused(Exception):
    """The command cannot run as declared (bad argv, not allowed, not found): not retried."""

    def __init__(self, error_type: str, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.exit_code = exit_code


def write_manifest(runs_dir: Path, run_id: str, manifest: Mapping[str, Any]) -> Path:
    """Write the run's manifest to RUNS/<run_id>/manifest.json (atomically: several attempts of
    one run may write it at once) and return its path. It stays until run retention removes it."""
    folder = run_folder(runs_dir, run_id)
    path = folder / MANIFEST_FILE
    if path.is_file():  # a run's manifest never changes; the rename below makes it whole
        return path
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=folder, prefix=".manifest-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(dict(manifest), out, indent=2, sort_keys=True)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return path


def run_command(
    spec: CommandSpec,
    contract: ExitContract,
    msg: Message,
    *,
    argv: object,
    manifest_path: str,
    log: AttemptLog,
    max_result_bytes: int,
) -> Message:
    """Run the program and describe how it ended, as `child.call_task` replies."""
    try:
        line = _command_line(spec, msg, argv)
        program = SHELL if isinstance(line, str) else line[0]
        env = _environment(spec, msg, manifest_path)
        resolved = _check_program(program, spec, msg, env)
        out_dir = _fresh_output_folder(msg)
    except CommandRefused as exc:
        return _refusal(exc)
    env["TREADLE_OUTPUT_DIR"] = str(out_dir)
    full = _with_manifest(spec, line, manifest_path)
    try:
        proc = subprocess.Popen(
            [SHELL, "-c", full] if isinstance(full, str) else full,
            executable=resolved,
            env=env,
            cwd=spec.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    except OSError as exc:
        return _refusal(
            CommandRefused(
                "CommandNotStarted",
                f"cannot start {program!r}: {exc.strerror or exc}",
                exit_code=NOT_FOUND_EXIT_CODE,
            )
        )
    assert proc.stdout is not None and proc.stderr is not None
    stderr_tail = bytearray()
    pumps = [
        pump(os.dup(proc.stdout.fileno()), log),
        pump(os.dup(proc.stderr.fileno()), log, keep=stderr_tail, keep_bytes=STDERR_TAIL_BYTES),
    ]
    proc.stdout.close()
    proc.stderr.close()
    code = proc.wait()
    for p in pumps:
        p.join(DRAIN_S)
    if any(p.is_alive() for p in pumps):  # something the program started still holds its pipes
        kill_stray_processes()
        for p in pumps:
            p.join(DRAIN_S)
    return _ending(
        code,
        contract,
        program=program,
        stderr_tail=tail(bytes(stderr_tail)),
        out_dir=out_dir,
        max_result_bytes=max_result_bytes,
    )


def _command_line(spec: CommandSpec, msg: Message, argv: object) -> tuple[str, ...] | str:
    """The argv to run: a test's override, the fixed one, or what the task function returned."""
    chosen = msg.get("command_argv") or (spec.argv if spec.argv is not None else argv)
    shell = spec.shell and not msg.get("command_argv")
    try:
        return check_argv(f"task {msg['task_id']!r}", chosen, shell=shell)
    except DagDefinitionError as exc:
        raise CommandRefused("CommandInvalid", str(exc)) from None


def _environment(spec: CommandSpec, msg: Message, manifest_path: str) -> dict[str, str]:
    return {
        **os.environ,
        "TREADLE_RUN_ID": msg["run_id"],
        "TREADLE_DAG_ID": msg["dag_id"],
        "TREADLE_TASK_ID": msg["task_id"],
        "TREADLE_ATTEMPT": str(msg["attempt"]),
        "TREADLE_MAP_INDEX": str(msg.get("map_index", -1)),
        "TREADLE_TRACE_ID": trace_id(msg["run_id"]),
        "TREADLE_MANIFEST_FILE": manifest_path,
        **spec.env,
    }


def _check_program(program: str, spec: CommandSpec, msg: Message, env: Mapping[str, str]) -> str:
    """The program's absolute path, if the allow-lists let it run; else CommandRefused."""
    if spec.cwd is not None and os.sep in program and not os.path.isabs(program):
        resolved = shutil.which(str(Path(spec.cwd) / program))  # relative to where it runs
    else:
        resolved = shutil.which(program, path=env.get("PATH"))
    resolved = os.path.abspath(resolved) if resolved else None
    patterns: Sequence[str] = msg.get("command_allowlist") or ()
    if not program_allowed(program, resolved, patterns):
        raise CommandRefused(
            "CommandNotAllowed",
            f"program {program!r}{f' ({resolved})' if resolved else ''} is not on the command allow-list "
            f"{ALLOWLIST_VARIABLE} ({', '.join(patterns)})",
        )
    if spec.allowed is not None and not program_allowed(program, resolved, spec.allowed or ("",)):
        raise CommandRefused(
            "CommandNotAllowed",
            f"program {program!r}{f' ({resolved})' if resolved else ''} is not in the task's allowed= list "
            f"({', '.join(spec.allowed) or 'empty'})",
        )
    if resolved is None:
        raise CommandRefused(
            "CommandNotFound",
            f"program {program!r} was not found (or is not executable) on this worker's PATH",
            exit_code=NOT_FOUND_EXIT_CODE,
        )
    return resolved


def _fresh_output_folder(msg: Message) -> Path:
    runs_dir = Path(msg.get("runs_dir") or tempfile.mkdtemp(prefix="treadle-runs-"))
    try:
        folder = output_folder(
            runs_dir,
            run_id=msg["run_id"],
            task_id=msg["task_id"],
            map_index=int(msg.get("map_index", -1)),
            attempt=int(msg["attempt"]),
        )
        if folder.exists():  # left by an attempt with this number that never reported
            shutil.rmtree(folder)
        folder.mkdir(mode=0o700, parents=True)
    except (OSError, ValueError) as exc:
        raise CommandRefused("OutputFolderUnavailable", f"cannot create the output folder: {exc}") from None
    return folder


def _with_manifest(spec: CommandSpec, line: tuple[str, ...] | str, manifest_path: str) -> list[str] | str:
    if isinstance(line, str):
        return f"{line} {MANIFEST_ARG} {shlex.quote(manifest_path)}" if spec.manifest_arg else line
    return [*line, MANIFEST_ARG, manifest_path] if spec.manifest_arg else list(line)


def _ending(
    code: int,
    contract: ExitContract,
    *,
    program: str,
    stderr_tail: str,
    out_dir: Path,
    max_result_bytes: int,
) -> Message:
    """The reply for a program that exited with `code` (negative: killed by that signal)."""
    how = f"exited with code {code}"
    if code < 0:
        with contextlib.suppress(ValueError):
            how = f"was killed by {signal.Signals(-code).name}"
        code = 128 - code  # as a shell reports it
    exit_code = min(code, 255)
    disposition = contract.classify(exit_code)
    outputs = read_outputs(out_dir)
    if disposition is Disposition.SUCCESS:
        return _success(out_dir, outputs, exit_code=exit_code, max_result_bytes=max_result_bytes)
    message = (
        f"command {os.path.basename(program)!r} {how}: {disposition.value.replace('_', ' ')} under its "
        f"exit-code contract ({contract.describe()})"
    )
    if stderr_tail.strip():
        message += f"\nstderr (last {STDERR_TAIL_BYTES} bytes):\n{stderr_tail}"
    reply: Message = {
        "ok": False,
        "error_type": "CommandFailed",
        "frame": os.path.basename(program),
        "message": message,
        "traceback": "",
        "disposition": disposition.value,
        "retryable": disposition is Disposition.RETRYABLE,
        "exit_code": exit_code,
    }
    if outputs:
        reply["outputs"] = outputs
    return reply


def _success(out_dir: Path, outputs: dict[str, Any], *, exit_code: int, max_result_bytes: int) -> Message:
    value: Any = None  # Any: the job's JSON
    result = out_dir / RESULT_FILE
    if result.exists():
        size = result.stat().st_size
        if size > max_result_bytes:
            return _bad_output(
                "ResultTooLarge", f"{RESULT_FILE} is {size} bytes; the limit is {max_result_bytes}"
            )
        try:
            value = json.loads(result.read_bytes(), parse_constant=_refuse_constant)
        except (ValueError, OSError) as exc:
            return _bad_output("ResultNotJson", f"{RESULT_FILE} is not strict JSON: {exc}")
    reply: Message = {"ok": True, "value": value, "exit_code": exit_code}
    if outputs:
        reply["outputs"] = outputs
    return reply


def read_outputs(out_dir: Path) -> dict[str, Any]:
    """The structured outputs present in `out_dir`, by name without ".json". One that is too
    large or not JSON is stored as {"error": why} in its place: the attempt's outcome is the
    program's, whatever its reports look like."""
    outputs: dict[str, Any] = {}
    for name in ATTEMPT_OUTPUT_FILES:
        path = out_dir / name
        try:
            size = path.stat().st_size
        except OSError:
            continue
        key = name.removesuffix(".json")
        if size > MAX_OUTPUT_FILE_BYTES:
            outputs[key] = {
                "error": f"{name} is {size} bytes; the limit is {MAX_OUTPUT_FILE_BYTES}, so it was not kept"
            }
            continue
        try:
            outputs[key] = json.loads(path.read_bytes(), parse_constant=_refuse_constant)
        except (ValueError, OSError) as exc:
            outputs[key] = {"error": f"{name} is not strict JSON: {exc}"}
    return outputs


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _bad_output(error_type: str, message: str) -> Message:
    # The same job writes the same file again: retrying cannot help.
    return {
        "ok": False,
        "error_type": error_type,
        "frame": "",
        "message": message,
        "traceback": "",
        "retryable": False,
        "disposition": Disposition.NON_RETRYABLE.value,
        "exit_code": 0,
    }


def _refusal(exc: CommandRefused) -> Message:
    reply: Message = {
        "ok": False,
        "error_type": exc.error_type,
        "frame": "",
        "message": str(exc),
        "traceback": "",
        "retryable": False,
        "disposition": Disposition.NON_RETRYABLE.value,
        # None: the program did not run (call_task would otherwise record a Python failure's 1).
        "exit_code": exc.exit_code,
    }
    return reply
