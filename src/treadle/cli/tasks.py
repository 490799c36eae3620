"""`treadle tasks test` (run one task in this process, recording nothing), `treadle tasks clear`
(run finished tasks of a run again), `treadle tasks inspection` / `resolve` (task instances
whose attempt ended with an unknown commit) and `treadle tasks cancel`."""

from __future__ import annotations

import json
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from treadle.authoring.context import TaskContext
from treadle.authoring.loader import load_file, load_folder, make_importable
from treadle.authoring.specs import Dag, TaskNode
from treadle.cli.main import Context, cli, identity, pass_context
from treadle.cli.render import emit_json, fmt_time, show_cancellation, table
from treadle.domain.conf_limits import check_conf_depth, check_conf_limits, json_text_depth
from treadle.domain.params import resolve_params
from treadle.engine import cancellation, inspection
from treadle.engine.clearing import clear_tasks
from treadle.errors import DagDefinitionError, DagNotFound, InvalidRequest, TreadleError
from treadle.worker.attempt_log import AttemptLog
from treadle.worker.command import run_command, write_manifest


@cli.group("tasks")
def tasks_group() -> None:
    """Tasks of a DAG."""


def _parse_upstream(values: tuple[str, ...]) -> dict[str, Any]:
    parsed: dict[str, Any] = {}
    for item in values:
        task_id, sep, raw = item.partition("=")
        if not sep:
            raise InvalidRequest(f"--upstream {item!r} must look like TASK_ID=JSON")
        try:
            parsed[task_id] = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise InvalidRequest(f"--upstream {task_id}: invalid JSON ({exc})") from None
    return parsed


@tasks_group.command("test")
@click.argument("dag_id")
@click.argument("task_id")
@click.option("--conf", default="{}", help="Run parameters as a JSON object.")
@click.option("--upstream", multiple=True, help="Result of an upstream task: TASK_ID=JSON.")
@click.option(
    "--map-index",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="For a mapped task: which element of the list it maps over to run with.",
)
@pass_context
def test_cmd(
    ctx: Context, dag_id: str, task_id: str, conf: str, upstream: tuple[str, ...], map_index: int
) -> None:
    """Run TASK_ID of DAG_ID in-process and print its result (nothing is recorded).

    The DAG is imported from the file the database registered it from (so this works wherever
    the scheduler's DAG folder is), else from the DAG folder (TREADLE_DAGS_FOLDER). --conf is
    checked against the DAG's params and their defaults filled in, exactly as a trigger does.
    A mapped task runs with element --map-index of the list given for the task it maps over.
    """
    dag = _find_dag(ctx, dag_id)
    node = dag.tasks.get(task_id)
    if node is None:
        raise InvalidRequest(
            f"DAG {dag_id!r} has no task {task_id!r}; tasks: " + ", ".join(sorted(dag.tasks))
        )
    results = _parse_upstream(upstream)
    needed = sorted(a.upstream for a in [*node.args, *node.kwargs.values()] if a.upstream)
    missing = [u for u in needed if u not in results]
    if missing:
        raise InvalidRequest(
            "this task takes the results of "
            + ", ".join(missing)
            + "; pass them with --upstream TASK_ID=JSON"
        )
    params = _params(dag, conf)

    def value(ref: Any) -> Any:
        return results.get(ref.upstream) if ref.upstream else ref.literal

    kwargs = {k: value(v) for k, v in node.kwargs.items()}
    if node.map_arg is not None:
        kwargs[node.map_arg] = _element(kwargs[node.map_arg], node.kwargs[node.map_arg].upstream, map_index)
    if node.takes_context:
        kwargs["context"] = TaskContext(
            run_id="test",
            dag_id=dag_id,
            task_id=task_id,
            logical_date=datetime.now(UTC),
            attempt=1,
            params=params,
            upstream_results=results,
            map_index=map_index if node.map_arg is not None else -1,
        )
    result = node.fn(*[value(a) for a in node.args], **kwargs)
    if node.command is not None:
        result = _test_command(ctx, node, dag_id=dag_id, argv=result, params=params)
    click.echo(json.dumps(result, indent=2, default=str))


def _find_dag(ctx: Context, dag_id: str) -> Dag:
    """DAG_ID imported from the file the registry recorded for it if that file still defines it,
    else from the settings' DAG folder; DagNotFound naming where it looked."""
    limit_s = ctx.settings.dag_import_timeout_s
    recorded = _registered_file(ctx, dag_id)
    if recorded is not None:
        make_importable(recorded.parent)
        dags, error = load_file(recorded, time_limit_s=limit_s)
        if error is not None:
            raise DagDefinitionError(
                f"{recorded} (where DAG {dag_id!r} was registered from): {error.message}"
            )
        found = next((d for d in dags if d.dag_id == dag_id), None)
        if found is not None:
            return found
    folder = ctx.settings.dags_folder
    loaded = load_folder(folder, time_limit_s=limit_s)
    dag = loaded.dags.get(dag_id)
    if dag is None:
        looked = f"{recorded} (registered) nor in {folder}" if recorded is not None else str(folder)
        hint = f"; load errors: {', '.join(loaded.errors)}" if loaded.errors else ""
        raise DagNotFound(f"no DAG {dag_id!r} in {looked} (TREADLE_DAGS_FOLDER){hint}")
    return dag


def _registered_file(ctx: Context, dag_id: str) -> Path | None:
    """The file the database registered DAG_ID from, if it is registered and the file exists
    (None without a usable database: `tasks test` works before anything was synced)."""
    from treadle.engine import queries

    try:
        registered = queries.get_dag(ctx.db, dag_id)
    except TreadleError:
        return None
    if registered is None or not registered.fileloc:
        return None
    path = Path(registered.fileloc)
    return path if path.is_file() else None


def _params(dag: Dag, conf: str) -> dict[str, Any]:
    """The params a run triggered with `conf` would get: checked against the DAG's params schema
    and rules (ParamsInvalid naming every problem), defaults filled in."""
    check_conf_depth(json_text_depth(conf), source="--conf")
    try:
        parsed = json.loads(conf)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"--conf is not valid JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise InvalidRequest("--conf must be a JSON object")
    check_conf_limits(parsed)
    structure = dag.structure()
    return resolve_params(dag.dag_id, structure.params_schema, parsed, rules=structure.param_rules)


def _element(listed: Any, source: str | None, map_index: int) -> Any:
    """Element `map_index` of the list a mapped task maps over (InvalidRequest naming the problem)."""
    if not isinstance(listed, list):
        raise InvalidRequest(f"this task maps over the result of {source}: pass a JSON list with --upstream")
    if map_index >= len(listed):
        raise InvalidRequest(f"--map-index {map_index} is past the end of the list ({len(listed)} elements)")
    return listed[map_index]


def _test_command(ctx: Context, node: TaskNode, *, dag_id: str, argv: Any, params: dict[str, Any]) -> Any:
    """Run a command task's program with a scratch manifest and output folder; print what it wrote
    (to stderr) and return its result, or raise naming how it failed."""
    assert node.command is not None
    with tempfile.TemporaryDirectory(prefix="treadle-tasks-test-") as scratch:
        msg = {
            "run_id": "test",
            "dag_id": dag_id,
            "task_id": node.task_id,
            "attempt": 1,
            "runs_dir": scratch,
            "command_allowlist": list(ctx.settings.command_allowlist),
        }
        manifest = write_manifest(
            Path(scratch), "test", {"run_id": "test", "dag_id": dag_id, "params": params}
        )
        log_path = Path(scratch) / "attempt.log"
        log = AttemptLog(log_path, max_bytes=ctx.settings.log_max_bytes)
        try:
            reply = run_command(
                node.command,
                node.settings.exit_contract,
                msg,
                argv=argv if node.command.argv is None else None,
                manifest_path=str(manifest),
                log=log,
                max_result_bytes=ctx.settings.max_result_bytes,
            )
        finally:
            log.close()
        click.echo(log_path.read_text(errors="replace") if log_path.exists() else "", err=True, nl=False)
    if not reply.get("ok"):
        raise InvalidRequest(
            f"{reply['error_type']} (exit code {reply.get('exit_code')}): {reply['message']}"
        )
    return reply.get("value")


@tasks_group.command("clear")
@click.argument("run_id")
@click.argument("task_ids", nargs=-1, required=True)
@click.option("--downstream", is_flag=True, help="Clear everything downstream of the named tasks too.")
@click.option("--reason", default="", help="Why (recorded in the audit log).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def clear_cmd(
    ctx: Context, run_id: str, task_ids: tuple[str, ...], downstream: bool, reason: str, as_json: bool
) -> None:
    """Run finished TASK_IDs of RUN_ID again, with a fresh retry budget (attempt history is kept).

    A cleared task is queued when its trigger rule is met by its upstreams as they stand, else
    it waits for them. A mapped task runs its instances again, or expands again when the task it
    maps over is cleared too. Tasks still queued or running are refused. A finished run reopens.
    """
    report = clear_tasks(
        ctx.db, run_id, list(dict.fromkeys(task_ids)), downstream=downstream, actor=identity(), reason=reason
    )
    if as_json:
        emit_json(report)
        return
    click.echo(f"cleared {len(report.cleared)} task(s) of run {run_id}: {', '.join(report.cleared)}")


@tasks_group.command("inspection")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def inspection_cmd(ctx: Context, as_json: bool) -> None:
    """List task instances that need inspection (an attempt ended with an unknown commit)."""
    found = inspection.list_needs_inspection(ctx.db)
    if as_json:
        emit_json(found)
        return
    table(
        "Needs inspection (resolve with `treadle tasks resolve RUN_ID TASK_ID --as ... --reason ...`)",
        ["run", "task", "attempt", "exit code", "error", "since"],
        [
            (
                i.task_instance.run_id,
                i.task_instance.task_id,
                i.task_instance.attempt,
                ""
                if i.last_attempt is None or i.last_attempt.exit_code is None
                else i.last_attempt.exit_code,
                f"{i.last_attempt.error_type}: {i.last_attempt.error_message}"[:100]
                if i.last_attempt
                else "",
                fmt_time(i.task_instance.ended_at),
            )
            for i in found
        ],
    )


@tasks_group.command("resolve")
@click.argument("run_id")
@click.argument("task_id")
@click.option(
    "--as",
    "resolution",
    required=True,
    type=click.Choice([r.value for r in inspection.Resolution]),
    help="success: the output is complete, go on; failed: dead-letter it; requeue: run it again.",
)
@click.option("--reason", required=True, help="What the inspection found (required; kept in the audit log).")
@click.option("--map-index", type=int, default=-1, show_default=True, help="Map index of a mapped task.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def resolve_cmd(
    ctx: Context, run_id: str, task_id: str, resolution: str, reason: str, map_index: int, as_json: bool
) -> None:
    """Resolve TASK_ID of RUN_ID, which needs inspection after an unknown commit (audited)."""
    updated = inspection.resolve(
        ctx.db,
        run_id,
        task_id,
        resolution=inspection.Resolution(resolution),
        reason=reason,
        actor=identity(),
        map_index=map_index,
    )
    if as_json:
        emit_json(updated)
        return
    click.echo(f"resolved {task_id} of run {run_id} as {resolution}: now {updated.state}")


@tasks_group.command("cancel")
@click.argument("run_id")
@click.argument("task_id")
@click.option("--reason", default="", help="Why (recorded in the audit log).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def cancel_task_cmd(ctx: Context, run_id: str, task_id: str, reason: str, as_json: bool) -> None:
    """Cancel a task of a run (each of its mapped instances); its downstream tasks' trigger
    rules decide what follows (an all_success task becomes upstream_failed, an all_done
    clean-up still runs)."""
    done = cancellation.cancel_task(ctx.db, run_id, task_id, actor=identity(), reason=reason)
    show_cancellation(done, as_json)
