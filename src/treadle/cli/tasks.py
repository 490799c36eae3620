"""`treadle tasks test`: run one task in this process, for debugging. Records nothing."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import click

from treadle.authoring.context import TaskContext
from treadle.authoring.loader import load_folder
from treadle.cli.main import Context, cli, pass_context
from treadle.errors import DagNotFound, InvalidRequest


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
@pass_context
def test_cmd(ctx: Context, dag_id: str, task_id: str, conf: str, upstream: tuple[str, ...]) -> None:
    """Run TASK_ID of DAG_ID in-process and print its result (nothing is recorded)."""
    loaded = load_folder(ctx.settings.dags_folder)
    dag = loaded.dags.get(dag_id)
    if dag is None:
        hint = f"; load errors: {', '.join(loaded.errors)}" if loaded.errors else ""
        raise DagNotFound(f"no DAG {dag_id!r} in {ctx.settings.dags_folder}{hint}")
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
    try:
        params = json.loads(conf)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"--conf is not valid JSON: {exc}") from None

    def value(ref: Any) -> Any:
        return results.get(ref.upstream) if ref.upstream else ref.literal

    kwargs = {k: value(v) for k, v in node.kwargs.items()}
    if node.takes_context:
        kwargs["context"] = TaskContext(
            run_id="test",
            dag_id=dag_id,
            task_id=task_id,
            logical_date=datetime.now(UTC),
            attempt=1,
            params=params,
            upstream_results=results,
        )
    result = node.fn(*[value(a) for a in node.args], **kwargs)
    click.echo(json.dumps(result, indent=2, default=str))
