"""Task process: forked by the fork server with the DAG folder imported, runs task callables
on request.

User code runs only here, so a crash, `os._exit` or segfault ends one attempt, not the worker.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import select
import signal
import socket
import tempfile
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from datetime import datetime
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from treadle.authoring.context import MAX_OUTLET_METADATA_BYTES, Poke, TaskContext
from treadle.authoring.loader import FolderModules, dag_files, folder_signature, load_file, make_importable
from treadle.authoring.outcomes import PYTHON_FAILURE_EXIT_CODE, TaskOutcome
from treadle.authoring.sensing import deferred_of
from treadle.authoring.specs import Dag, TaskNode, downstream_of
from treadle.domain.branching import InvalidBranch, chosen_branches
from treadle.domain.exit_codes import Disposition, ExitContract
from treadle.worker.attempt_log import AttemptLog, redirected_output
from treadle.worker.command import run_command, write_manifest
from treadle.worker.containment import become_subreaper, kill_stray_processes
from treadle.worker.protocol import Message, error_message, receive, send

log = logging.getLogger("treadle.worker.child")

#: Environment variable naming the run manifest's JSON file while a task runs.
MANIFEST_ENV = "TREADLE_MANIFEST_FILE"


class DagCache:
    """DAGs imported from the folder, reloaded from their file when a run's version differs.

    The fork server keeps one up to date with `refresh` before each fork, so its children start
    from the current code; a child re-imports a file itself when an attempt's version differs.
    DAG files may import modules of the folder; when one of those changes, every DAG file is
    imported again (any of them may use it), with the module's current code.

    A `lazy` cache imports nothing at first: the fork server imports the folder one file at a
    time with `preload_next` between requests, and a child forked before it finished imports
    the one file an attempt's DAG comes from when it needs it (`get` with the file's path).
    """

    def __init__(
        self,
        folder: Path,
        *,
        file_limit_s: float | None = None,
        skip: Collection[str] = (),
        on_file: Callable[[str], None] | None = None,
        lazy: bool = False,
    ) -> None:
        self.folder = folder
        self.file_limit_s = file_limit_s
        self.skip = frozenset(skip)
        #: Hears of each file before `refresh` imports it (the fork server reports progress).
        self.on_file = on_file
        self.dags: dict[str, Dag] = {}
        self.hashes: dict[str, str] = {}
        #: DAGs built by each imported file, and the (mtime_ns, size) it had when imported.
        self.by_file: dict[str, list[Dag]] = {}
        self.stats: dict[str, tuple[int, int]] = {}
        #: sha256 of each imported file, taken when it was imported (the code version that runs).
        self.file_hashes: dict[str, str] = {}
        #: Every Python file of the folder as last refreshed (DAG files and their modules).
        self.signature: dict[str, tuple[int, int]] = {}
        self.modules = FolderModules(folder)
        #: Files still to import ahead of need (`preload_next`); empty once the folder is in.
        self.pending: list[str] = []
        self.signature_at_start: dict[str, tuple[int, int]] = {}
        make_importable(folder)
        if lazy:
            self.signature_at_start = {p: (m, n) for p, m, n in folder_signature(folder)}
            self.pending = [str(p) for p in dag_files(folder) if str(p) not in self.skip]
        else:
            self.reload_all()

    def _load(self, path: str) -> list[Dag]:
        self.file_hashes[path] = file_hash(path)
        return load_file(Path(path), time_limit_s=self.file_limit_s)[0]

    def code_version(self, dag: Dag) -> str | None:
        """sha256 of the file the DAG was imported from, as it was when imported."""
        return self.file_hashes.get(dag.fileloc)

    def reload_all(self) -> None:
        """Import the whole folder (but the files in `skip`)."""
        self.by_file, self.stats, self.signature = {}, {}, {}
        self.refresh(self.skip)

    def refresh(self, skip: Collection[str]) -> list[str]:
        """Import again the files that changed (size or mtime) since they were imported, the new
        ones, and those no longer in `skip`; forget removed and skipped files; import every file
        again when a module they may import changed. Returns the files imported. As load_folder:
        each file within the time limit, a DAG id defined twice is kept from the first file (in
        path order)."""
        skip = frozenset(skip)
        signature = {path: (mtime, size) for path, mtime, size in folder_signature(self.folder)}
        if signature == self.signature and skip == self.skip:
            return []
        if self.modules.forget_changed():
            self.by_file = {}
        names = {str(p) for p in dag_files(self.folder)}
        current = {path: stat for path, stat in signature.items() if path in names}
        imported = []
        for path in list(self.by_file):
            if path not in current or path in skip:
                del self.by_file[path]
        for path, stat in current.items():
            if path in skip or (path in self.by_file and self.stats.get(path) == stat):
                continue
            if self.on_file is not None:
                self.on_file(path)
            self.by_file[path] = self._load(path)
            imported.append(path)
        self.modules.note_imported(signature)
        self.stats = {p: s for p, s in current.items() if p in self.by_file}
        self.signature = signature
        self.skip = skip
        dags: dict[str, Dag] = {}
        for path in sorted(self.by_file):
            for d in self.by_file[path]:
                dags.setdefault(d.dag_id, d)
        self.dags = dags
        self.hashes = {k: d.structure().content_hash() for k, d in dags.items()}
        return imported

    @property
    def preloading(self) -> bool:
        """True while files of the folder are still to be imported ahead of need."""
        return bool(self.pending)

    def preload_next(self) -> None:
        """Import the next file of the folder not imported yet; once none is left, bring the
        cache up to date with the folder as `refresh` does (files changed meanwhile)."""
        if self.pending:
            path = self.pending.pop(0)
            if path not in self.by_file and path not in self.skip:
                stat = self.signature_at_start.get(path)
                if self.on_file is not None:
                    self.on_file(path)
                self._add_file(path, self._load(path))
                if stat is not None:
                    self.stats[path] = stat
        if not self.pending:
            self.modules.note_imported(self.signature_at_start)
            self.refresh(self.skip)

    def _add_file(self, path: str, loaded: list[Dag]) -> None:
        """Take the DAGs of one newly imported file (a DAG id defined twice: the first file in
        path order keeps it)."""
        self.by_file[path] = loaded
        for d in loaded:
            existing = self.dags.get(d.dag_id)
            if existing is None or existing.fileloc == path or (existing.fileloc or "") > path:
                self.dags[d.dag_id] = d
                self.hashes[d.dag_id] = d.structure().content_hash()

    def _in_folder(self, path: str) -> bool:
        root = os.path.abspath(self.folder) + os.sep
        return os.path.abspath(path).startswith(root) and os.path.isfile(path)

    def get(self, dag_id: str, version_hash: str, fileloc: str = "") -> Dag:
        """Return the DAG, re-importing its file if the code on disk changed since it was loaded.

        `fileloc` is the file the DAG was registered from: a DAG this cache has not imported yet
        (a lazy cache) is imported from there alone, not with the whole folder."""
        if (
            dag_id not in self.dags
            and fileloc
            and fileloc not in self.skip
            and fileloc not in self.by_file
            and self._in_folder(fileloc)
        ):
            before = {path: (mtime, size) for path, mtime, size in folder_signature(self.folder)}
            self._add_file(fileloc, self._load(fileloc))
            if fileloc in before:
                self.stats[fileloc] = before[fileloc]
            self.modules.note_imported(before)
        if self.hashes.get(dag_id) != version_hash:
            current = self.dags.get(dag_id)
            if current is not None and current.fileloc:
                before = {path: (mtime, size) for path, mtime, size in folder_signature(self.folder)}
                self.modules.forget_changed()
                for d in self._load(current.fileloc):
                    self.dags[d.dag_id] = d
                    self.hashes[d.dag_id] = d.structure().content_hash()
                self.modules.note_imported(before)
            if self.hashes.get(dag_id) != version_hash:
                self.reload_all()
        found = self.dags.get(dag_id)
        if found is None:
            raise LookupError(f"DAG {dag_id!r} is not defined in {self.folder}")
        return found


def file_hash(path: str) -> str:
    """sha256 of a file's bytes ("" when it cannot be read)."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return ""


def _context(msg: Message, manifest_path: str | None) -> TaskContext:
    return TaskContext(
        run_id=msg["run_id"],
        dag_id=msg["dag_id"],
        task_id=msg["task_id"],
        logical_date=datetime.fromisoformat(msg["logical_date"]),
        attempt=msg["attempt"],
        params=msg.get("params") or {},
        manifest=msg.get("manifest") or {},
        manifest_path=manifest_path,
        upstream_results=msg.get("upstream_results") or {},
        outlets=tuple(msg.get("outlets") or ()),
        map_index=int(msg.get("map_index", -1)),
        poke=_poke(msg.get("poke")),
    )


def _poke(data: Any) -> Poke | None:
    """What a sensor's or submit-then-poll task's attempt knows of the earlier pokes."""
    if not isinstance(data, dict):
        return None
    first = data.get("first_poke_at")
    return Poke(
        state=data.get("state"),
        final=bool(data.get("final")),
        first_poke_at=datetime.fromisoformat(first) if isinstance(first, str) else None,
    )


@contextlib.contextmanager
def _manifest_file(msg: Message) -> Iterator[str | None]:
    """The run manifest as a JSON file, named in TREADLE_MANIFEST_FILE meanwhile.

    On a worker (the message names its runs folder) it is RUNS/<run_id>/manifest.json and stays
    after the attempt (run retention removes it); elsewhere it is a private temporary file.
    """
    manifest = msg.get("manifest")
    runs_dir = msg.get("runs_dir")
    if runs_dir:
        path = str(write_manifest(Path(runs_dir), msg["run_id"], manifest or {}))
        with _manifest_env(path):
            yield path
        return
    if not manifest:
        yield None
        return
    fd, path = tempfile.mkstemp(prefix=f"treadle-manifest-{msg['task_id']}-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(manifest, out, indent=2, sort_keys=True)
        with _manifest_env(path):
            yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


@contextlib.contextmanager
def _manifest_env(path: str) -> Iterator[None]:
    previous = os.environ.get(MANIFEST_ENV)
    os.environ[MANIFEST_ENV] = path
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(MANIFEST_ENV, None)
        else:
            os.environ[MANIFEST_ENV] = previous


def run_task(
    cache: DagCache, msg: Message, *, max_result_bytes: int, log: AttemptLog | None = None
) -> Message:
    """Run one task callable from the DAG folder (see call_task)."""
    roots = (str(cache.folder.resolve()), str(cache.folder))
    try:
        dag = cache.get(msg["dag_id"], msg["version_hash"], msg.get("fileloc") or "")
    except Exception as exc:
        return {"ok": False, **error_message(exc, user_roots=roots)}
    return call_task(
        dag,
        msg,
        max_result_bytes=max_result_bytes,
        user_roots=roots,
        code_version=cache.code_version(dag),
        log=log,
    )


def call_task(
    dag: Dag,
    msg: Message,
    *,
    max_result_bytes: int,
    user_roots: tuple[str, ...],
    code_version: str | None = None,
    log: AttemptLog | None = None,
) -> Message:
    """Run one task callable; return {"ok": True, "value": ...} or an error description.

    Every reply carries "exit_code" and "code_version" (sha256 of the DAG file that ran; taken
    from the file when not given). A failure carries its "disposition" under the exit-code
    contract: a `TaskOutcome` exception says it; `sys.exit(code)` is classified by the task's
    contract (exit 0 is a success with no result); any other exception is retryable. A success
    reply also carries "outlet_events" (dataset -> {"version", "metadata"}) when the task
    annotated its outlet events through `context.outlet_event`. A command task's program writes
    its output into `log` (a log that keeps nothing when None).
    """
    reply = _call_task(
        dag,
        msg,
        max_result_bytes=max_result_bytes,
        user_roots=user_roots,
        log=log or AttemptLog(None, max_bytes=0),
    )
    reply.setdefault("exit_code", 0 if reply.get("ok") else PYTHON_FAILURE_EXIT_CODE)
    reply["code_version"] = code_version if code_version is not None else file_hash(dag.fileloc) or None
    return reply


def _call_task(
    dag: Dag, msg: Message, *, max_result_bytes: int, user_roots: tuple[str, ...], log: AttemptLog
) -> Message:
    roots = user_roots
    context: TaskContext | None = None
    node = dag.tasks.get(msg["task_id"])
    try:
        node = _node(dag, msg["task_id"])
        kwargs: dict[str, Any] = dict(msg.get("kwargs") or {})
        with _manifest_file(msg) as manifest_path:
            if node.takes_context:
                context = _context(msg, manifest_path)
                kwargs["context"] = context
            value = _invoke(
                node, msg, kwargs, manifest_path=manifest_path, log=log, max_result_bytes=max_result_bytes
            )
        if isinstance(value, _CommandEnded):
            return value.reply
    except TaskOutcome as exc:
        return {
            "ok": False,
            **error_message(exc, user_roots=roots),
            "disposition": exc.disposition.value,
            "retryable": exc.disposition is Disposition.RETRYABLE,
            "exit_code": exc.exit_code,
            **({"outputs": _json_outputs(exc.outputs)} if exc.outputs else {}),
        }
    except SystemExit as exc:  # ends the attempt, not the child: classified by the contract
        failure = _exit_failure(
            exc, node.settings.exit_contract if node is not None else ExitContract(), roots
        )
        if failure is not None:
            return failure
        value = None
    except Exception as exc:
        return {"ok": False, **error_message(exc, user_roots=roots)}
    except BaseException as exc:  # e.g. KeyboardInterrupt raised by user code
        return {"ok": False, **error_message(exc, user_roots=roots)}
    assert node is not None  # a missing task raised above
    return _success_reply(dag, node, msg, value, context, max_result_bytes=max_result_bytes)


def _success_reply(
    dag: Dag,
    node: TaskNode,
    msg: Message,
    value: Any,
    context: TaskContext | None,
    *,
    max_result_bytes: int,
) -> Message:
    """The reply of a task function that returned `value`: checked as strict JSON within the
    size limit, a branch's choice resolved, outlet annotations checked."""
    try:
        # Strict JSON (no NaN/Infinity): what every backend stores and every reader parses.
        encoded = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        # The same code returns the same value again: retrying cannot help.
        return _not_retryable(
            "ResultNotSerializable",
            f"task {msg['task_id']!r} returned a value that is not strict JSON: {exc}",
        )
    if len(encoded) > max_result_bytes:
        return _not_retryable(
            "ResultTooLarge",
            f"result is {len(encoded)} bytes; the limit is {max_result_bytes} (TREADLE_MAX_RESULT_BYTES): "
            "store large data with `context.artifacts.put(name, data)` and return the URI it gives",
        )
    if node.branch:
        # A branch's result is the list of downstream tasks it chose (the others are skipped).
        try:
            value = chosen_branches(node.task_id, value, downstream_of(dag, node.task_id))
        except InvalidBranch as exc:
            return _not_retryable("InvalidBranch", str(exc))
    reply: Message = {"ok": True, "value": value}
    if context is not None and context.outlet_events:
        problem = _outlet_events_problem(context.outlet_events)
        if problem is not None:
            return problem
        reply["outlet_events"] = context.outlet_events
    return reply


def _node(dag: Dag, task_id: str) -> TaskNode:
    """The task placed in `dag` under `task_id` (LookupError naming both if there is none)."""
    node = dag.tasks.get(task_id)
    if node is None:
        raise LookupError(f"task {task_id!r} is not defined in DAG {dag.dag_id!r}")
    return node


def _exit_failure(exc: SystemExit, contract: ExitContract, roots: tuple[str, ...]) -> Message | None:
    """The failure reply for a task that called sys.exit with a code its contract does not
    count as success; None for a success."""
    code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    disposition = contract.classify(code)
    if disposition is Disposition.SUCCESS:
        return None
    return {
        "ok": False,
        **error_message(exc, user_roots=roots),
        "message": f"the task called sys.exit({exc.code!r}): {disposition.value.replace('_', ' ')} "
        f"under its exit-code contract ({contract.describe()})",
        "disposition": disposition.value,
        "retryable": disposition is Disposition.RETRYABLE,
        "exit_code": code,
    }


@dataclass(frozen=True, slots=True)
class _CommandEnded:
    """The reply of a command task's program (it replaces the callable's return value)."""

    reply: Message


def _invoke(
    node: TaskNode,
    msg: Message,
    kwargs: dict[str, Any],
    *,
    manifest_path: str | None,
    log: AttemptLog,
    max_result_bytes: int,
) -> Any:  # Any: whatever the task returns
    """Call the task's function; for a command task, run the program (with the argv the
    function returned, unless it is fixed) and return how it ended."""
    command = node.command
    if command is None:
        return node.fn(*(msg.get("args") or []), **kwargs)
    argv = node.fn(*(msg.get("args") or []), **kwargs) if command.argv is None else None
    if manifest_path is None:
        manifest_path = str(write_manifest(_scratch_runs_dir(), msg["run_id"], {}))
    return _CommandEnded(
        run_command(
            command,
            node.settings.exit_contract,
            msg,
            argv=argv,
            manifest_path=manifest_path,
            log=log,
            max_result_bytes=max_result_bytes,
        )
    )


def _scratch_runs_dir() -> Path:
    """A runs folder for a command run outside a worker without one (removed with /tmp)."""
    return Path(tempfile.mkdtemp(prefix="treadle-runs-"))


def _json_outputs(outputs: dict[str, Any]) -> dict[str, Any]:
    """Outputs an exception carried, as strict JSON (what is not is replaced by its repr)."""
    try:
        return dict(json.loads(json.dumps(outputs, allow_nan=False, default=repr)))
    except (TypeError, ValueError):
        return {"unserializable": repr(outputs)[:2000]}


def _outlet_events_problem(events: dict[str, dict[str, Any]]) -> Message | None:
    """The error reply for outlet metadata that is not strict JSON or over the limit, else None."""
    for name, event in sorted(events.items()):
        try:
            size = len(json.dumps(event.get("metadata") or {}, allow_nan=False))
        except (TypeError, ValueError) as exc:
            return _not_retryable(
                "OutletMetadataNotSerializable",
                f"metadata of the outlet event on dataset {name!r} is not strict JSON: {exc}",
            )
        if size > MAX_OUTLET_METADATA_BYTES:
            return _not_retryable(
                "OutletMetadataTooLarge",
                f"metadata of the outlet event on dataset {name!r} is {size} bytes serialized; "
                f"the limit is {MAX_OUTLET_METADATA_BYTES}",
            )
    return None


def _not_retryable(error_type: str, message: str) -> Message:
    """An error reply that the retry policy must not retry (the same code fails the same way)."""
    return {
        "ok": False,
        "error_type": error_type,
        "frame": "",
        "message": message,
        "traceback": "",
        "retryable": False,
        "disposition": Disposition.NON_RETRYABLE.value,
    }


def run_job_cancel(cache: DagCache, msg: Message) -> Message:
    """Run a submit-then-poll task's `cancel(handle)` for a cancelled or abandoned job."""
    try:
        dag = cache.get(msg["dag_id"], msg["version_hash"], msg.get("fileloc") or "")
        node = dag.tasks.get(msg["task_id"])
        job = deferred_of(node.fn) if node is not None else None
        if job is None:
            raise LookupError(
                f"task {msg['task_id']!r} of DAG {msg['dag_id']!r} is not a submit-then-poll task"
            )
        job.cancel(msg.get("handle"))
    except BaseException as exc:
        log.warning(
            "job cancel failed",
            extra={"event": "job.cancel_failed", "task_id": msg.get("task_id"), "error": repr(exc)},
        )
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"ok": True}


def run_callback(cache: DagCache, msg: Message) -> Message:
    """Run an on_retry / on_dead_letter callback from the DAG folder (see call_callback)."""
    try:
        dag = cache.get(msg["dag_id"], msg["version_hash"], msg.get("fileloc") or "")
    except Exception as exc:
        return {"ok": False, "error": repr(exc)}
    return call_callback(dag, msg)


def call_callback(dag: Dag, msg: Message) -> Message:
    """Run an on_retry / on_dead_letter callback; its failure is logged, never fatal."""
    try:
        settings = dag.tasks[msg["task_id"]].settings
        callback = settings.on_retry if msg["callback"] == "on_retry" else settings.on_dead_letter
        if callback is not None:
            callback(_context(msg, None), msg.get("error") or {})
    except BaseException as exc:
        log.warning(
            "callback failed",
            extra={
                "event": "task_instance.callback_failed",
                "callback": msg.get("callback"),
                "error": repr(exc),
            },
        )
        return {"ok": False, "error": repr(exc)}
    return {"ok": True}


def _watch_worker(conn: socket.socket) -> None:
    """Kill this child's whole group when the worker ends (even by SIGKILL), so an attempt never
    runs on beside its retry elsewhere (F1).

    The child's parent is the fork server, not the worker, so the parent-death signal cannot
    say it. The pipe to the worker can: the kernel sends SIGIO when its state changes (data, or
    the worker's end closing), and once the other end is closed (hang-up, whether or not a
    request is still unread) the handler kills the group. An operator's SIGTERM kills the
    group too.
    """
    hangup = select.POLLHUP | select.POLLRDHUP | select.POLLERR
    watch = select.poll()
    watch.register(conn.fileno(), hangup)

    def check(_signum: int = 0, _frame: object = None) -> None:
        if any(events & hangup for _fd, events in watch.poll(0)):
            os.killpg(0, signal.SIGKILL)

    signal.signal(signal.SIGTERM, lambda _sig, _frame: os.killpg(0, signal.SIGKILL))
    signal.signal(signal.SIGIO, check)
    fd = conn.fileno()
    fcntl.fcntl(fd, fcntl.F_SETOWN, os.getpid())
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_ASYNC)
    check()  # it may have ended before the watch was set


def forked_child_main(fd: int, cache: DagCache, max_result_bytes: int) -> None:
    """Entry point of a child forked by the fork server: own session and process group,
    subreaper, watch the worker, say "ready" on `fd` (its end of the pipe to the worker), then
    serve requests until EOF, with the DAGs the server had imported (`cache`)."""
    os.setsid()  # a timeout kills this child's whole group, grandchildren included
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.set_inheritable(fd, False)
    become_subreaper()
    watched = socket.socket(fileno=os.dup(fd))
    _watch_worker(watched)
    conn = Connection(fd)
    send(conn, {"ready": True})
    serve(conn, cache, max_result_bytes=max_result_bytes)


def serve(conn: Connection, cache: DagCache, *, max_result_bytes: int) -> None:
    """Run the attempts and callbacks that arrive on `conn`, one at a time, until EOF."""
    while True:
        try:
            msg = receive(conn)
        except (EOFError, OSError):
            return
        if msg["kind"] == "run":
            reply = _run_logged(cache, msg, max_result_bytes=max_result_bytes)
        elif msg["kind"] == "cancel_job":
            reply = run_job_cancel(cache, msg)
        else:
            reply = run_callback(cache, msg)
            kill_stray_processes()  # nothing a task started outlives its attempt (containment.py)
        send(conn, reply)


def _run_logged(cache: DagCache, msg: Message, *, max_result_bytes: int) -> Message:
    """Run an attempt with this process's stdout and stderr (and a command's) in its log file."""
    path = msg.get("log_path")
    log = AttemptLog(Path(path) if path else None, max_bytes=int(msg.get("log_max_bytes") or 0))
    try:
        if path is None:
            reply = run_task(cache, msg, max_result_bytes=max_result_bytes, log=log)
            kill_stray_processes()
            return reply
        # Containment once the output is restored: its report goes to the worker's log, and
        # nothing the task started is left holding the attempt's log.
        with redirected_output(log, before_drain=kill_stray_processes):
            reply = run_task(cache, msg, max_result_bytes=max_result_bytes, log=log)
        return reply
    finally:
        log.close()
