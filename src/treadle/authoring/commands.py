"""Command tasks: `CommandTask(...)` in a `@dag` body and `@task.command`, an external program
run by a worker (validated here; run by worker/command.py)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from treadle.authoring.settings import check_setting_names, resolve_settings
from treadle.authoring.specs import Dag, TaskNode, TaskOutput, check_identifier, current_dag
from treadle.domain.commands import CommandSpec
from treadle.errors import DagDefinitionError


def command_spec(
    where: str,
    *,
    argv: object = None,
    env: object = None,
    cwd: object = None,
    allowed: object = None,
    shell: object = False,
    manifest_arg: object = True,
) -> CommandSpec:
    """Validate a command's settings; `argv` None means a function returns it at run time."""
    if not isinstance(shell, bool) or not isinstance(manifest_arg, bool):
        raise DagDefinitionError(f"{where}: shell and manifest_arg must be True or False")
    fixed = None if argv is None else check_argv(where, argv, shell=shell)
    if env is None:
        env = {}
    if not isinstance(env, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise DagDefinitionError(f"{where}: env must be a mapping of strings to strings, got {env!r:.100}")
    if cwd is not None and not isinstance(cwd, str | os.PathLike):
        raise DagDefinitionError(f"{where}: cwd must be a path, got {cwd!r}")
    if allowed is not None and (
        isinstance(allowed, str)
        or not isinstance(allowed, Sequence)
        or not all(isinstance(a, str) for a in allowed)
    ):
        raise DagDefinitionError(
            f"{where}: allowed must be a list of program paths or names, got {allowed!r}"
        )
    return CommandSpec(
        argv=fixed,
        env=dict(env),
        cwd=None if cwd is None else os.fspath(cwd),
        allowed=None if allowed is None else tuple(allowed),
        shell=shell,
        manifest_arg=manifest_arg,
    )


def check_argv(where: str, argv: object, *, shell: bool) -> tuple[str, ...] | str:
    """A command line as run: a non-empty list of strings, or one string with `shell=True`."""
    if shell:
        if not isinstance(argv, str) or not argv.strip():
            raise DagDefinitionError(f"{where}: with shell=True the command must be one non-empty string")
        return argv
    if isinstance(argv, str | bytes) or not isinstance(argv, Sequence) or not argv:
        raise DagDefinitionError(
            f"{where}: argv must be a non-empty list of strings (a single string needs shell=True), "
            f"got {argv!r:.100}"
        )
    items = [os.fspath(a) if isinstance(a, os.PathLike) else a for a in argv]
    if not all(isinstance(a, str) for a in items) or not items[0]:
        raise DagDefinitionError(f"{where}: every argv item must be a string, got {argv!r:.100}")
    return tuple(str(a) for a in items)


def _fixed_command() -> None:
    """Stands in for the function of a CommandTask (its argv is fixed; nothing is called)."""


def CommandTask(
    *,
    task_id: str,
    argv: Sequence[str | os.PathLike[str]] | str,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    allowed: Sequence[str] | None = None,
    shell: bool = False,
    manifest_arg: bool = True,
    depends_on: Sequence[str] = (),
    **settings: Any,
) -> TaskOutput:
    """Place a task that runs an external program, inside a `@dag` function.

    The program runs without a shell (with `shell=True`, `argv` is one string run by /bin/sh),
    in the task process's group, under the task's timeout. `--run-manifest FILE` is appended to
    argv unless `manifest_arg=False`; the environment carries the TREADLE_* variables and `env`.
    Its exit code is classified by `exit_codes=` (default: 0 success, other codes retryable).
    `allowed` narrows TREADLE_COMMAND_ALLOWLIST for this task. Other settings as `@task`.
    """
    dag = current_dag()
    where = f"CommandTask {task_id!r}"
    if dag is None:
        raise DagDefinitionError(f"{where} must be placed inside a @dag function")
    check_setting_names(settings, where)
    spec = command_spec(
        where, argv=argv, env=env, cwd=cwd, allowed=allowed, shell=shell, manifest_arg=manifest_arg
    )
    return place_command(dag, task_id=task_id, spec=spec, settings=settings, depends_on=depends_on)


def place_command(
    dag: Dag, *, task_id: str, spec: CommandSpec, settings: Mapping[str, Any], depends_on: Sequence[str]
) -> TaskOutput:
    """Add a fixed-argv command task to `dag`."""
    check_identifier("task id", task_id)
    where = f"dag {dag.dag_id!r} task {task_id!r}"
    node = TaskNode(
        task_id=task_id,
        fn=_fixed_command,
        settings=resolve_settings(dag.default_args, settings, where),
        args=(),
        kwargs={},
        takes_context=False,
        command=spec,
    )
    dag.add_task(node)
    for up in depends_on:
        dag.add_edge(up, task_id)
    return TaskOutput(dag, task_id)
