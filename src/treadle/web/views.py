"""What the pages show, assembled from the engine's and the store's read functions (no SQL here)
and laid out for drawing: the DAG list rows, the grid, the layered graph, the Gantt chart."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from markupsafe import Markup, escape
from sqlalchemy.engine import Connection

from treadle.domain.access import Principal, Role
from treadle.domain.dag_version import DagStructure
from treadle.domain.records import DagInfo, RunInfo, TaskInstanceInfo
from treadle.domain.timetable import ScheduleSpec
from treadle.engine import queries, schedules
from treadle.engine.scheduling import LEADER_LEASE
from treadle.store import grid as grid_store
from treadle.store import leases
from treadle.store import runs as run_store
from treadle.store import task_instances as ti_store
from treadle.store.database import Database, db_now

#: Runs shown as squares in the DAG list and as columns of the grid.
RECENT_RUNS = 25
#: Most tasks drawn in one column of the graph.
GRAPH_COLUMN_TASKS = 20
#: States that count as "not done yet" when a run's or cell's colour is chosen (worst first).
_PRIORITY = (
    "dead_letter",
    "failed",
    "upstream_failed",
    "needs_inspection",
    "running",
    "retry_wait",
    "up_for_reschedule",
    "queued",
    "scheduled",
    "pending",
    "cancelled",
    "skipped",
    "success",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class DagRow:
    """One line of the DAG list."""

    dag: DagInfo
    schedule_words: str
    timezone: str
    next_fire_at: datetime | None
    #: Oldest first, at most RECENT_RUNS.
    runs: list[RunInfo]


def visible(principal: Principal, team: str) -> bool:
    """True if the principal may read objects of `team`."""
    teams = principal.teams_with(Role.VIEWER)
    return teams is None or team in teams


def dag_rows(db: Database, principal: Principal) -> list[DagRow]:
    """The DAGs the principal may read, with schedule and recent runs."""
    dags = [d for d in queries.list_dags(db) if visible(principal, d.team)]
    rows = schedules.list_schedules(db)

    def recent(conn: Connection) -> dict[str, list[RunInfo]]:
        return {d.dag_id: run_store.list_runs(conn, dag_id=d.dag_id, limit=RECENT_RUNS) for d in dags}

    runs = db.query(recent)
    found: list[DagRow] = []
    for d in dags:
        row = rows.get(d.dag_id)
        spec = ScheduleSpec.from_json(row.spec) if row is not None and row.spec else None
        found.append(
            DagRow(
                dag=d,
                schedule_words=schedules.in_words(spec),
                timezone=spec.timezone if spec is not None else "UTC",
                next_fire_at=row.next_fire_at if row is not None and spec is not None else None,
                runs=list(reversed(runs[d.dag_id])),
            )
        )
    return found


def worst(states: list[str]) -> str:
    """The state that best summarises several (a failure first, then unfinished work, then success)."""
    present = set(states)
    return next((s for s in _PRIORITY if s in present), "pending")


class Cell(NamedTuple):
    """One task of one run in the grid (a mapped task's instances folded into one cell); a
    named tuple, as a grid may hold 12,500 of them."""

    state: str
    #: Mapped tasks: how many instances are in each state; empty for a plain task.
    counts: dict[str, int]
    href: str
    label: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Grid:
    """Recent runs (oldest first) by tasks (in graph order)."""

    runs: list[RunInfo]
    task_ids: list[str]
    cells: dict[tuple[str, str], Cell]
    #: Durations (seconds) of each task's successful attempt per run, oldest run first.
    durations: dict[str, list[float | None]]

    def rows(self) -> list[tuple[str, Markup]]:
        """Each task with its row of cells as HTML (built here: a 25 x 500 grid is 12,500 cells,
        too many for a template loop to render quickly)."""
        found = []
        empty = '<td><span class="cell none" aria-hidden="true"></span></td>'
        run_ids = [r.run_id for r in self.runs]
        for task_id in self.task_ids:
            parts = []
            for run_id in run_ids:
                c = self.cells.get((run_id, task_id))
                if c is None:
                    parts.append(empty)
                    continue
                mapped, count = (" mapped", str(sum(c.counts.values()))) if c.counts else ("", "")
                cls = f"cell s-{c.state}{mapped}"
                parts.append(f'<td><a class="{cls}" href="{c.href}" title="{c.label}">{count}</a></td>')
            found.append((task_id, Markup("".join(parts))))
        return found


def task_href(run_id: str, task_id: str, map_index: int = -1) -> str:
    """The task instance page of a run's task."""
    tail = f"?map_index={map_index}" if map_index >= 0 else ""
    return f"/runs/{run_id}/tasks/{task_id}{tail}"


def grid(db: Database, dag_id: str, task_ids: list[str], *, runs: int = RECENT_RUNS) -> Grid:
    """The grid of the DAG's newest `runs` runs."""

    def work(
        conn: Connection,
    ) -> tuple[list[RunInfo], list[tuple[str, str, int, str]], dict[tuple[str, str], float]]:
        found = run_store.list_runs(conn, dag_id=dag_id, limit=runs)
        ids = [r.run_id for r in found]
        return (
            list(reversed(found)),
            grid_store.task_states(conn, ids),
            grid_store.success_durations(conn, ids),
        )

    found, states, seconds = db.query(work)
    order = list(task_ids)
    known = set(order)
    grouped: dict[tuple[str, str], list[tuple[int, str]]] = defaultdict(list)
    for run_id, task_id, map_index, state in states:
        grouped[(run_id, task_id)].append((map_index, state))
        if task_id not in known:
            known.add(task_id)
            order.append(task_id)
    # Cells carry their href and label escaped for HTML already (Grid.rows joins them as is); the
    # label leaves the run out: the cell's column header names it.
    cells: dict[tuple[str, str], Cell] = {}
    safe_runs = {r.run_id: str(escape(r.run_id)) for r in found}
    safe_tasks = {t: str(escape(t)) for t in order}
    for (run_id, task_id), group in grouped.items():
        run_html, task_html = safe_runs.get(run_id) or str(escape(run_id)), safe_tasks[task_id]
        href = f"/runs/{run_html}/tasks/{task_html}"
        if len(group) > 1 or group[0][0] >= 0:
            mapped = [state for index, state in group if index >= 0]
            counts = dict(Counter(mapped))
            summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
            label = f"{task_html}: {len(mapped)} mapped ({summary})"
            cells[(run_id, task_id)] = Cell(worst(mapped), counts, href, label)
        else:
            state = group[0][1]
            cells[(run_id, task_id)] = Cell(state, {}, href, f"{task_html}: {state}")
    durations = {t: [seconds.get((r.run_id, t)) for r in found] for t in order}
    return Grid(runs=found, task_ids=order, cells=cells, durations=durations)


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    """A task placed in the layered graph."""

    task_id: str
    x: float
    y: float
    state: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Edge:
    """An upstream -> downstream edge as an SVG path."""

    path: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Graph:
    """The DAG drawn in layers, left to right."""

    nodes: list[Node]
    edges: list[Edge]
    width: float
    height: float
    node_width: float = 170.0
    node_height: float = 34.0


def topological(structure: DagStructure) -> list[str]:
    """Task ids with every upstream before its downstream (ties by declaration order)."""
    layer = layers(structure)
    declared = list(structure.tasks)
    return sorted(declared, key=lambda t: (layer[t], declared.index(t)))


def layers(structure: DagStructure) -> dict[str, int]:
    """Each task's layer: the length of the longest upstream chain leading to it."""
    found: dict[str, int] = {}

    def depth(task_id: str, trail: frozenset[str]) -> int:
        if task_id in found:
            return found[task_id]
        task = structure.tasks.get(task_id)
        ups = [u for u in (task.upstream if task else ()) if u in structure.tasks and u not in trail]
        found[task_id] = 1 + max((depth(u, trail | {task_id}) for u in ups), default=-1)
        return found[task_id]

    for task_id in structure.tasks:
        depth(task_id, frozenset())
    return found


def graph(structure: DagStructure, states: dict[str, str]) -> Graph:
    """The DAG as a layered drawing, nodes coloured by `states` (task id -> state)."""
    w, h, gap_x, gap_y, pad = 170.0, 34.0, 60.0, 18.0, 10.0
    layer = layers(structure)
    by_layer: dict[int, list[str]] = defaultdict(list)
    for task_id in structure.tasks:
        by_layer[layer[task_id]].append(task_id)
    # A wide layer (hundreds of parallel tasks) wraps into several columns of at most
    # GRAPH_COLUMN_TASKS, so the drawing stays readable instead of thousands of pixels tall.
    columns: dict[int, list[str]] = {}
    for depth in sorted(by_layer):
        ids = by_layer[depth]
        for start in range(0, len(ids), GRAPH_COLUMN_TASKS):
            columns[len(columns)] = ids[start : start + GRAPH_COLUMN_TASKS]
    spots: dict[str, tuple[float, float]] = {}
    for col, ids in columns.items():
        for row, task_id in enumerate(ids):
            spots[task_id] = (pad + col * (w + gap_x), pad + row * (h + gap_y))
    nodes = [Node(task_id=t, x=x, y=y, state=states.get(t, "none")) for t, (x, y) in spots.items()]
    edges: list[Edge] = []
    for task_id, task in structure.tasks.items():
        x2, y2 = spots[task_id]
        for up in task.upstream:
            if up not in spots:
                continue
            x1, y1 = spots[up]
            sx, sy, ex, ey = x1 + w, y1 + h / 2, x2, y2 + h / 2
            mid = (sx + ex) / 2
            edges.append(
                Edge(path=f"M{sx:.0f},{sy:.0f} C{mid:.0f},{sy:.0f} {mid:.0f},{ey:.0f} {ex - 4:.0f},{ey:.0f}")
            )
    most = max((len(ids) for ids in columns.values()), default=1)
    width = pad * 2 + (max(columns, default=0) + 1) * (w + gap_x) - gap_x
    height = pad * 2 + most * (h + gap_y) - gap_y
    return Graph(nodes=nodes, edges=edges, width=width, height=height, node_width=w, node_height=h)


def run_states(db: Database, run_id: str) -> dict[str, str]:
    """Each task's state in one run (a mapped task's instances summarised)."""
    instances = db.query(lambda conn: ti_store.list_for_run(conn, run_id))
    by_task: dict[str, list[str]] = defaultdict(list)
    for t in instances:
        by_task[t.task_id].append(t.state)
    return {task_id: worst(states) for task_id, states in by_task.items()}


@dataclass(frozen=True, slots=True, kw_only=True)
class Bar:
    """One task instance in the Gantt chart (x and width in chart units of 0..1000)."""

    label: str
    state: str
    x: float
    width: float
    y: float
    href: str
    seconds: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Gantt:
    """A run's task instances on a time axis."""

    bars: list[Bar]
    height: float
    span_s: float
    row_height: float = 22.0
    ticks: list[tuple[float, str]] = field(default_factory=list)


def gantt(instances: list[TaskInstanceInfo], *, now: datetime) -> Gantt:
    """The Gantt chart of a run's task instances (those not started yet sit at the start, empty)."""
    started = [t.started_at for t in instances if t.started_at is not None]
    start = min(started) if started else now
    ends = [t.ended_at or now for t in instances if t.started_at is not None]
    span = max(((max(ends) if ends else now) - start).total_seconds(), 1.0)
    bars: list[Bar] = []
    row = 22.0
    for i, t in enumerate(sorted(instances, key=lambda t: (t.started_at or now, t.id))):
        label = t.task_id if t.map_index < 0 else f"{t.task_id}[{t.map_index}]"
        if t.started_at is None:
            x, width, secs = 0.0, 0.0, None
        else:
            end = t.ended_at or now
            x = (t.started_at - start).total_seconds() / span * 1000
            secs = (end - t.started_at).total_seconds()
            width = max(secs / span * 1000, 2.0)
        bars.append(
            Bar(
                label=label,
                state=t.state,
                x=x,
                width=width,
                y=i * row,
                href=task_href(t.run_id, t.task_id, t.map_index),
                seconds=secs,
            )
        )
    from treadle.web.render import duration

    ticks = [(i * 250.0, duration(span * i / 4)) for i in range(5)]
    return Gantt(bars=bars, height=max(len(bars), 1) * row, span_s=span, row_height=row, ticks=ticks)


def sparkline(
    values: list[float | None], *, width: float = 160, height: float = 28
) -> tuple[list[tuple[float, float]], float | None]:
    """The (x, y) points of a duration trend (runs without a value skipped) and the latest value."""
    known = [(i, v) for i, v in enumerate(values) if v is not None]
    if not known:
        return [], None
    top = max(v for _, v in known) or 1.0
    step = width / max(len(values) - 1, 1)
    points = [(round(i * step, 1), round(height - 3 - v / top * (height - 6), 1)) for i, v in known]
    return points, known[-1][1]


@dataclass(frozen=True, slots=True, kw_only=True)
class Leader:
    """Who leads the schedulers (from the leader lease)."""

    holder: str | None
    epoch: int
    renewed_at: datetime | None
    expires_at: datetime | None
    now: datetime


def leader(db: Database) -> Leader | None:
    """The scheduler leader lease as stored (None: no scheduler ever led)."""

    def work(conn: Connection) -> Leader | None:
        lease = leases.get(conn, LEADER_LEASE)
        if lease is None:
            return None
        return Leader(
            holder=lease.holder,
            epoch=lease.epoch,
            renewed_at=lease.renewed_at,
            expires_at=lease.expires_at,
            now=db_now(conn),
        )

    return db.query(work)


def params_fields(schema: dict[str, Any] | None) -> list[dict[str, Any]]:  # Any: JSON Schema
    """The trigger form's fields from a params JSON Schema: name, input type, default, help."""
    if not schema:
        return []
    props: dict[str, Any] = schema.get("properties", {}) or {}
    required = set(schema.get("required", []) or [])
    found = []
    for name, prop in props.items():
        kind = prop.get("type")
        kind = kind[0] if isinstance(kind, list) and kind else kind
        if "enum" in prop:
            widget = "select"
        elif kind == "boolean":
            widget = "checkbox"
        elif kind in ("integer", "number"):
            widget = "number"
        elif kind in ("object", "array"):
            widget = "json"
        else:
            widget = "text"
        found.append(
            {
                "name": name,
                "widget": widget,
                "type": kind or "string",
                "default": prop.get("default"),
                "enum": prop.get("enum", []),
                "help": prop.get("description", ""),
                "required": name in required,
                "minimum": prop.get("minimum"),
                "maximum": prop.get("maximum"),
                "secret": bool(prop.get("format") == "password" or prop.get("secret")),
            }
        )
    return found
