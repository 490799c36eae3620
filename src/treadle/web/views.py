"""What the pages show, assembled from the engine's and the store's read functions (no SQL here)
and laid out for drawing: the DAG list rows, the grid, the layered graph, the Gantt chart."""

from __future__ import annotations

import functools
import json
import threading
import weakref
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from itertools import repeat
from typing import Any, NamedTuple

from markupsafe import Markup, escape
from sqlalchemy.engine import Connection

from treadle.domain.access import Principal, Role
from treadle.domain.dag_version import DagStructure, DagVersion
from treadle.domain.records import DagInfo, RunInfo
from treadle.domain.states import TERMINAL_RUN_STATES, TERMINAL_TASK_STATES, TaskState
from treadle.domain.task_records import TaskInstanceInfo
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


#: One letter per state in the grid's rows; the page's script turns each back into a cell (the
#: table carries the mapping in data-codes, so the letters are never spelled out in the script).
STATE_CODES: dict[str, str] = {
    state: chr(ord("a") + i)
    for i, state in enumerate(dict.fromkeys([*_PRIORITY, *(s.value for s in TaskState)]))
}
#: The code of a run that has no instance of the task (a task added after the run began).
NO_CELL = "-"


@dataclass(frozen=True, slots=True, kw_only=True)
class Grid:
    """Recent runs (oldest first) by tasks (in graph order), compactly: a 25 x 500 grid is 12,500
    cells, so each task is one string of state codes, one per run, and the page's script draws
    the cells (links to their task instances) from it."""

    runs: list[RunInfo]
    task_ids: list[str]
    #: Task -> one STATE_CODES letter per run, oldest first (NO_CELL: the run has no such task).
    codes: dict[str, str]
    #: Task -> run column -> how many of a mapped task's instances are in each state.
    mapped: dict[str, dict[int, dict[str, int]]]
    #: Durations (seconds) of each task's successful attempt per run, oldest run first.
    durations: dict[str, list[float | None]]

    def states_of(self, run_id: str) -> dict[str, str]:
        """Each task's state (a mapped task: the worst of its instances) in one run of the grid."""
        column = next((i for i, r in enumerate(self.runs) if r.run_id == run_id), None)
        if column is None:
            return {}
        names = {code: state for state, code in STATE_CODES.items()}
        return {t: names[c[column]] for t, c in self.codes.items() if c[column] != NO_CELL}

    def code_map(self) -> str:
        """The codes as `letter:state,...` (the table's data-codes)."""
        return ",".join(f"{code}:{state}" for state, code in STATE_CODES.items())

    def body(self) -> Markup:
        """The table's rows, each a task with its codes (and a mapped task's counts) as data
        attributes; the script adds the cells."""
        rows = []
        for task_id in self.task_ids:
            task = escape(task_id)
            counts = self.mapped.get(task_id)
            extra = f' data-mapped="{escape(json.dumps(counts, separators=(",", ":")))}"' if counts else ""
            rows.append(
                f'<tr data-task="{task}" data-cells="{self.codes[task_id]}"{extra}>'
                f'<th scope="row">{task}</th></tr>'
            )
        return Markup("\n".join(rows))


def task_href(run_id: str, task_id: str, map_index: int = -1) -> str:
    """The task instance page of a run's task."""
    tail = f"?map_index={map_index}" if map_index >= 0 else ""
    return f"/runs/{run_id}/tasks/{task_id}{tail}"


@dataclass(frozen=True, slots=True, kw_only=True)
class _Column:
    """One run's column of the grid: each task's state code, mapped tasks' counts, durations."""

    codes: dict[str, str]
    mapped: dict[str, dict[str, int]]
    seconds: dict[str, float]


class _FinishedColumns:
    """Columns of finished runs, per database, least recently used dropped first.

    A finished run's task instances no longer change: clearing it or requeueing its dead letters
    sets the run running again (and a new end time when it finishes), which the key holds. A
    column is kept only when all its instances are finished too, so a clear that lands between
    reading the run and reading its instances is never kept.
    """

    def __init__(self, size: int) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._by_db: weakref.WeakKeyDictionary[Database, OrderedDict[tuple[str, str, datetime], _Column]] = (
            weakref.WeakKeyDictionary()
        )

    @staticmethod
    def key(run: RunInfo) -> tuple[str, str, datetime] | None:
        """The cache key of a finished run (None: the run may still change)."""
        if run.state not in _FINISHED_RUNS or run.ended_at is None:
            return None
        return (run.run_id, run.state, run.ended_at)

    def get(self, db: Database, key: tuple[str, str, datetime]) -> _Column | None:
        with self._lock:
            found = self._by_db.get(db)
            column = found.get(key) if found is not None else None
            if column is not None and found is not None:
                found.move_to_end(key)
            return column

    def clear(self) -> None:
        with self._lock:
            self._by_db.clear()

    def put(self, db: Database, key: tuple[str, str, datetime], column: _Column) -> None:
        with self._lock:
            found = self._by_db.setdefault(db, OrderedDict())
            found[key] = column
            while len(found) > self._size:
                found.popitem(last=False)


#: Columns kept: ten DAG grids of 25 runs and some (a 500-task column is about 60 KB).
FINISHED_COLUMNS = 300
_FINISHED_RUNS = frozenset(s.value for s in TERMINAL_RUN_STATES)
_FINISHED_CODES = frozenset(STATE_CODES[s.value] for s in TERMINAL_TASK_STATES)
_columns = _FinishedColumns(FINISHED_COLUMNS)


def forget_finished_columns() -> None:
    """Drop every kept grid column (they are read again on the next view)."""
    _columns.clear()


def _read_columns(conn: Connection, run_ids: list[str], timed: list[str]) -> dict[str, _Column]:
    """The columns of `run_ids` (durations only for `timed`), from one row per run."""
    cells = grid_store.run_cells(conn, run_ids)
    seconds = grid_store.success_seconds(conn, timed)
    with_mapped = [r for r in run_ids if r in cells and cells[r].mapped]
    counts: dict[str, dict[str, dict[str, int]]] = {}
    for run_id, task_id, state, n in grid_store.mapped_counts(conn, with_mapped):
        counts.setdefault(run_id, {}).setdefault(task_id, {})[state] = n
    other = STATE_CODES["pending"]
    columns: dict[str, _Column] = {}
    for run_id in run_ids:
        found = cells.get(run_id)
        codes = (
            dict(zip(found.task_ids, map(STATE_CODES.get, found.states, repeat(other)), strict=True))
            if found is not None
            else {}
        )
        mapped = counts.get(run_id, {})
        for task_id, by_state in mapped.items():
            codes[task_id] = STATE_CODES.get(worst(list(by_state)), other)
        columns[run_id] = _Column(codes=codes, mapped=mapped, seconds=seconds.get(run_id, {}))
    return columns


def grid(
    db: Database, dag_id: str, task_ids: list[str], *, runs: int = RECENT_RUNS, durations: bool = True
) -> Grid:
    """The grid of the DAG's newest `runs` runs (tasks of the runs that `task_ids` lacks, e.g.
    removed from the DAG since, come last). Finished runs' columns are read once and kept.
    `durations=False`: the runs still going have none (the refreshed grid does not show them)."""

    def work(conn: Connection) -> tuple[list[RunInfo], dict[str, _Column]]:
        found = list(reversed(run_store.list_runs(conn, dag_id=dag_id, limit=runs)))
        columns: dict[str, _Column] = {}
        for r in found:
            key = _columns.key(r)
            column = _columns.get(db, key) if key is not None else None
            if column is not None:
                columns[r.run_id] = column
        missing = [r.run_id for r in found if r.run_id not in columns]
        if missing:
            timed = [r.run_id for r in found if durations or _columns.key(r) is not None]
            read = _read_columns(conn, missing, [r for r in timed if r in missing])
            for r in found:
                key = _columns.key(r)
                column = read.get(r.run_id)
                if (
                    column is not None
                    and key is not None
                    and _FINISHED_CODES.issuperset(column.codes.values())
                ):
                    _columns.put(db, key, column)
            columns.update(read)
        return found, columns

    found, by_run = db.query(work)
    return _assembled(found, [by_run[r.run_id] for r in found], task_ids, durations=durations)


def _assembled(found: list[RunInfo], columns: list[_Column], task_ids: list[str], *, durations: bool) -> Grid:
    """The grid of runs `found` from their columns (in the same order)."""
    order = list(task_ids)
    known = set(order)
    for column in columns:
        if not known.issuperset(column.codes):
            for task_id in column.codes:
                if task_id not in known:
                    known.add(task_id)
                    order.append(task_id)
    # Each run's column in task order, then read across: the work is done in C (map, zip,
    # join), not once per cell in Python.
    if columns:
        per_run = ["".join(map(c.codes.get, order, repeat(NO_CELL))) for c in columns]
        codes = dict(zip(order, map("".join, zip(*per_run, strict=True)), strict=True))
    else:
        codes = dict.fromkeys(order, "")
    mapped: dict[str, dict[int, dict[str, int]]] = {}
    for i, column in enumerate(columns):
        for task_id, counts in column.mapped.items():
            mapped.setdefault(task_id, {})[i] = counts
    seconds: dict[str, list[float | None]] = {}
    if durations and columns:
        by_task = zip(*[list(map(c.seconds.get, order)) for c in columns], strict=True)
        seconds = dict(zip(order, map(list, by_task), strict=True))
    elif durations:
        seconds = {t: [] for t in order}
    return Grid(runs=found, task_ids=order, codes=codes, mapped=mapped, durations=seconds)


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    """A task placed in the layered graph."""

    task_id: str
    x: float
    y: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Graph:
    """The DAG drawn in layers, left to right (the same for every view of a DAG version: kept)."""

    nodes: list[Node]
    #: Every upstream -> downstream edge as SVG paths, ready to embed.
    edges: Markup
    width: float
    height: float
    node_width: float = 170.0
    node_height: float = 34.0

    def svg(self, dag_id: str, states: dict[str, str], selected: str | None) -> Markup:
        """The drawing, nodes coloured by `states` (task id -> state), each linking to its task
        instance in run `selected` (built here: a 500-task DAG is 500 nodes)."""
        w, h = round(self.width), round(self.height)
        run = escape(selected) if selected else None
        parts = [
            f'<svg class="graph" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" '
            f'aria-label="Task graph of {escape(dag_id)}">'
            '<defs><marker id="arrow" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="7" markerHeight="7" '
            'orient="auto"><path d="M0,0 L8,4 L0,8 z" class="arrowhead"/></marker></defs>',
            self.edges,
        ]
        nw, nh = self.node_width, self.node_height
        for n in self.nodes:
            state = states.get(n.task_id, "none")
            task = escape(n.task_id)
            short = n.task_id if len(n.task_id) <= 27 else n.task_id[:21] + "…"
            href = f"/runs/{run}/tasks/{task}" if run else "#"
            light = ' class="on-light"' if state in _LIGHT_NODES else ""
            parts.append(
                f'<a href="{href}" aria-label="{task}: {state}"{light}>'
                f'<rect class="node s-{state}" x="{n.x}" y="{n.y}" rx="6" width="{nw}" height="{nh}"/>'
                f'<text class="node-label" x="{n.x + 10}" y="{n.y + 21}">{escape(short)}</text>'
                f"<title>{task}: {state}</title></a>"
            )
        parts.append("</svg>")
        return Markup("\n".join(parts))


#: Node states drawn light, so their label is dark.
_LIGHT_NODES = frozenset({"pending", "scheduled", "skipped", "none", "retry_wait", "upstream_failed"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Drawing:
    """What the pages draw of one DAG version: its tasks in graph order and its layered graph."""

    order: list[str]
    graph: Graph


_drawings: OrderedDict[str, Drawing] = OrderedDict()
_drawings_lock = threading.Lock()
#: DAG versions whose drawing is kept.
DRAWINGS = 64


def drawing(version: DagVersion) -> Drawing:
    """The version's task order and graph, laid out once per version (by its content hash)."""
    with _drawings_lock:
        found = _drawings.get(version.version_hash)
        if found is not None:
            _drawings.move_to_end(version.version_hash)
            return found
    made = Drawing(order=topological(version.structure), graph=graph(version.structure))
    with _drawings_lock:
        _drawings[version.version_hash] = made
        while len(_drawings) > DRAWINGS:
            _drawings.popitem(last=False)
    return made


def topological(structure: DagStructure) -> list[str]:
    """Task ids with every upstream before its downstream (ties by declaration order)."""
    layer = layers(structure)
    declared = {t: i for i, t in enumerate(structure.tasks)}
    return sorted(declared, key=lambda t: (layer[t], declared[t]))


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


def graph(structure: DagStructure) -> Graph:
    """The DAG as a layered drawing."""
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
    nodes = [Node(task_id=t, x=x, y=y) for t, (x, y) in spots.items()]
    edges: list[str] = []
    for task_id, task in structure.tasks.items():
        x2, y2 = spots[task_id]
        for up in task.upstream:
            if up not in spots:
                continue
            x1, y1 = spots[up]
            sx, sy, ex, ey = x1 + w, y1 + h / 2, x2, y2 + h / 2
            mid = (sx + ex) / 2
            edges.append(
                f'<path class="edge" d="M{sx:.0f},{sy:.0f} C{mid:.0f},{sy:.0f} {mid:.0f},{ey:.0f} '
                f'{ex - 4:.0f},{ey:.0f}" marker-end="url(#arrow)"/>'
            )
    most = max((len(ids) for ids in columns.values()), default=1)
    width = pad * 2 + (max(columns, default=0) + 1) * (w + gap_x) - gap_x
    height = pad * 2 + most * (h + gap_y) - gap_y
    return Graph(
        nodes=nodes, edges=Markup("".join(edges)), width=width, height=height, node_width=w, node_height=h
    )


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


class Trend(NamedTuple):
    """A task's duration trend drawn as a sparkline, in tenths of a pixel (whole numbers: the
    trend table of a 500-task DAG writes 12,500 points)."""

    #: The polyline's points attribute (`x,y x,y ...`); empty: no successful attempt.
    points: str
    #: The newest point (marked with a dot).
    last: tuple[int, int] | None
    #: The newest duration in seconds.
    latest: float | None


def sparkline(values: list[float | None], *, width: float = 160, height: float = 28) -> Trend:
    """The sparkline of a duration trend (runs without a value skipped) and the latest value;
    coordinates in tenths of a pixel (the SVG's viewBox is ten times its size)."""
    present = [(i, v) for i, v in enumerate(values) if v is not None]
    if not present:
        return Trend("", None, None)
    top = max([v for _, v in present])
    xs = _sparkline_xs(len(values), width)
    base, scale = (height - 3) * 10, (height - 6) * 10 / (top or 1.0)
    # `:.0f` rounds as round() does (half to even); y is never negative.
    points = " ".join([f"{xs[i]},{base - v * scale:.0f}" for i, v in present])
    i, latest = present[-1]
    return Trend(points, (int(xs[i]), round(base - latest * scale)), latest)


@functools.lru_cache(maxsize=64)
def _sparkline_xs(count: int, width: float) -> tuple[str, ...]:
    """The x coordinates of `count` points (the same for every task of a grid)."""
    step = width * 10 / max(count - 1, 1)
    return tuple(str(round(i * step)) for i in range(count))


def trend_rows(task_ids: list[str], durations: dict[str, list[float | None]]) -> Markup:
    """The duration trend table's rows, a sparkline per task (built here rather than in the
    template: a 500-task DAG is 500 rows of 25 points, and the template's per-value escaping
    was a fifth of the DAG page's time)."""
    from treadle.web.render import duration

    rows = []
    for task_id in task_ids:
        task = escape(task_id)
        trend = sparkline(durations.get(task_id, []))
        if trend.last is not None:
            cx, cy = trend.last
            drawn = (
                f'<svg class="spark" viewBox="-30 0 1660 280" width="166" height="28" role="img" '
                f'aria-label="durations of {task} over the last runs"><polyline points="{trend.points}"/>'
                f'<circle cx="{cx}" cy="{cy}" r="25"/></svg>'
            )
        else:
            drawn = '<span class="muted small">no successful attempt</span>'
        latest = escape(duration(trend.latest))
        rows.append(f'<tr><th scope="row">{task}</th>\n  <td>{drawn}</td>\n  <td>{latest}</td></tr>')
    return Markup("\n".join(rows))


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
