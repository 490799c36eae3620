"""Pages of DAGs: the list (with load errors), one DAG (grid, graph, trend, contract, trigger), pause."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, Response

from treadle.api.deps import authorize, get_db, require
from treadle.api.guard import Caller
from treadle.api.routes.dags import NEXT_FIRES, dag_or_404
from treadle.domain.access import Action
from treadle.engine import dag_detail, pausing, queries, schedules
from treadle.engine.runs import trigger_run
from treadle.errors import InvalidRequest, ParamsInvalid
from treadle.store.database import Database
from treadle.web import views
from treadle.web.forms import Form, Posted
from treadle.web.render import fragment, page, see_other, shown_errors, viewer

router = APIRouter(include_in_schema=False)
Db = Annotated[Database, Depends(get_db)]


@router.get("/", response_class=HTMLResponse)
@shown_errors
def dag_list(request: Request, db: Db, _caller: Annotated[Caller, require(Action.READ_DAGS)]) -> Response:
    """Every DAG the viewer may read, with schedule, next run, pause switch and recent runs."""
    who = viewer(request)
    rows = views.dag_rows(db, who.caller.principal)
    errors = queries.list_load_errors(db) if who.can("read_load_errors") else []
    return page(request, "dags.html", title="DAGs", rows=rows, load_errors=errors)


@router.get("/fragments/dags", response_class=HTMLResponse)
@shown_errors
def dag_list_rows(
    request: Request, db: Db, _caller: Annotated[Caller, require(Action.READ_DAGS)]
) -> Response:
    """The DAG list's rows (the page refreshes them while open)."""
    who = viewer(request)
    return fragment("dag_rows.html", rows=views.dag_rows(db, who.caller.principal), viewer=who)


def _dag_page(
    request: Request, db: Database, dag_id: str, *, run: str | None, status: int = 200, **trigger: Any
) -> Response:  # Any: the trigger form's values and errors
    who = viewer(request)
    detail = dag_detail.dag_detail(db, dag_id, runs=1)
    authorize(who.caller, Action.READ_DAG, team=detail.dag.team)
    structure = detail.version.structure
    drawn = views.drawing(detail.version)
    grid = views.grid(db, dag_id, drawn.order)
    selected = run or (grid.runs[-1].run_id if grid.runs else None)
    if selected in {r.run_id for r in grid.runs}:
        states = grid.states_of(selected)
    else:
        states = views.run_states(db, selected) if selected else {}
    spec = structure.schedule
    fires = (
        [s.fire_at for s in schedules.upcoming(spec, after=detail.now, count=NEXT_FIRES)]
        if spec is not None and spec.is_timed
        else []
    )
    return page(
        request,
        "dag.html",
        status=status,
        title=dag_id,
        detail=detail,
        structure=structure,
        grid=grid,
        graph=drawn.graph,
        states=states,
        selected=selected,
        trend_rows=views.trend_rows(grid.task_ids, grid.durations),
        fires=fires,
        schedule_words=schedules.in_words(spec),
        timezone=spec.timezone if spec is not None else "UTC",
        fields=views.params_fields(structure.params_schema),
        values=trigger.get("values", {}),
        errors=trigger.get("errors", {}),
        general_error=trigger.get("general_error", ""),
    )


@router.get("/dags/{dag_id}", response_class=HTMLResponse)
@shown_errors
def dag_page(
    request: Request,
    db: Db,
    _caller: Annotated[Caller, require(Action.READ_DAG)],
    dag_id: str,
    run: Annotated[str | None, Query(max_length=250)] = None,
) -> Response:
    """One DAG: grid, graph (coloured by the selected run), trends, contract, next fires, trigger."""
    return _dag_page(request, db, dag_id, run=run)


@router.get("/fragments/dags/{dag_id}/grid", response_class=HTMLResponse)
@shown_errors
def dag_grid(
    request: Request, db: Db, _caller: Annotated[Caller, require(Action.READ_DAG)], dag_id: str
) -> Response:
    """The DAG's grid alone (the page refreshes it while open)."""
    who = viewer(request)
    dag = dag_or_404(db, dag_id)
    authorize(who.caller, Action.READ_DAG, team=dag.team)
    order = views.drawing(queries.dag_version(db, dag_id)).order
    return fragment("grid.html", grid=views.grid(db, dag_id, order, durations=False))


def conf_from_form(fields: list[dict[str, Any]], form: Form) -> tuple[dict[str, Any], dict[str, str]]:
    """The trigger's conf from the form's fields (typed by the schema), and per-field errors."""
    conf: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for f in fields:
        name, widget = f["name"], f["widget"]
        if widget == "checkbox":
            conf[name] = form.has(name)
            continue
        text = form.get(name)
        if text == "":
            if f["required"] and f["default"] is None:
                errors[name] = "required"
            continue
        if widget == "number":
            try:
                conf[name] = int(text) if f["type"] == "integer" else float(text)
            except ValueError:
                errors[name] = f"not {'an integer' if f['type'] == 'integer' else 'a number'}: {text!r}"
        elif widget == "json":
            try:
                conf[name] = json.loads(text)
            except ValueError as exc:
                errors[name] = f"not JSON: {exc}"
        else:
            conf[name] = text
    return conf, errors


def _field_of(path: str, names: list[str]) -> str | None:
    """The form field a violation's JSON path points into (None: the conf as a whole)."""
    rest = path[1:] if path.startswith("$") else path
    rest = rest.lstrip(".")
    head = rest.split(".")[0].split("[")[0]
    return head if head in names else None


@router.post("/dags/{dag_id}/trigger", response_class=HTMLResponse)
@shown_errors
def trigger(
    request: Request,
    db: Db,
    _caller: Annotated[Caller, require(Action.TRIGGER_RUN)],
    dag_id: str,
    form: Posted,
) -> Response:
    """Start a manual run; errors in the params are shown next to their fields."""
    who = viewer(request)
    dag = dag_or_404(db, dag_id)
    authorize(who.caller, Action.TRIGGER_RUN, team=dag.team)
    structure = queries.dag_structure(db, dag_id)
    fields = views.params_fields(structure.params_schema)
    values = dict(form.items())
    conf, errors = conf_from_form(fields, form)
    general = ""
    if not errors:
        try:
            run = trigger_run(
                db,
                dag_id,
                conf=conf,
                triggered_by=who.caller.principal.actor,
                default_queue_timeout_s=request.app.state.queue_timeout_s,
                address=who.caller.address,
            )
        except ParamsInvalid as exc:
            names = [f["name"] for f in fields]
            problems = []
            for v in exc.violations:
                field = _field_of(v.path, names)
                if field is not None:
                    errors.setdefault(field, v.message)
                else:
                    problems.append(f"{v.path}: {v.message}")
            general = "; ".join(problems)
        except InvalidRequest as exc:
            general = str(exc)
        else:
            return see_other(f"/dags/{dag_id}?run={run.run_id}#grid")
    return _dag_page(
        request,
        db,
        dag_id,
        run=None,
        values=values,
        errors=errors,
        general_error=general or "the run was not started: correct the fields marked below",
    )


def _pause(request: Request, db: Database, dag_id: str, form: Form, *, paused: bool) -> Response:
    who = viewer(request)
    dag = dag_or_404(db, dag_id)
    authorize(who.caller, Action.PAUSE_DAG, team=dag.team)
    pausing.set_paused(db, dag_id, paused=paused, actor=who.caller.principal.actor)
    back = form.get("next")
    return see_other(back if back.startswith("/") and not back.startswith("//") else f"/dags/{dag_id}")


@router.post("/dags/{dag_id}/pause")
@shown_errors
def pause(
    request: Request, db: Db, _caller: Annotated[Caller, require(Action.PAUSE_DAG)], dag_id: str, form: Posted
) -> Response:
    """Pause a DAG (no new scheduled runs)."""
    return _pause(request, db, dag_id, form, paused=True)


@router.post("/dags/{dag_id}/unpause")
@shown_errors
def unpause(
    request: Request, db: Db, _caller: Annotated[Caller, require(Action.PAUSE_DAG)], dag_id: str, form: Posted
) -> Response:
    """Unpause a DAG."""
    return _pause(request, db, dag_id, form, paused=False)
