"""Child process that imports DAG code once and runs task callables on request.

User code runs only here, so a crash, `os._exit` or segfault ends one attempt, not the worker.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import multiprocessing
import os
import signal
import sys
import tempfile
from collections.abc import Collection, Iterator
from datetime import datetime
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from treadle.authoring.context import MAX_OUTLET_METADATA_BYTES, TaskContext
from treadle.authoring.loader import load_file, load_folder
from treadle.authoring.specs import Dag
from treadle.worker.containment import become_subreaper, kill_stray_processes
from treadle.worker.protocol import Message, error_message, receive, send

log = logging.getLogger("treadle.worker.child")

#: Environment variable naming the run manifest's JSON file while a task runs.
MANIFEST_ENV = "TREADLE_MANIFEST_FILE"


class DagCache:
    """DAGs imported from the folder, reloaded from their file when a run's version differs."""

    def __init__(
        self, folder: Path, *, file_limit_s: float | None = None, skip: Collection[str] = ()
    ) -> None:
        self.folder = folder
        self.file_limit_s = file_limit_s
        self.skip = frozenset(skip)
        self.dags: dict[str, Dag] = {}
        self.hashes: dict[str, str] = {}
        self.reload_all()

    def reload_all(self) -> None:
        """Import the whole folder."""
        self.dags = dict(load_folder(self.folder, time_limit_s=self.file_limit_s, skip=self.skip).dags)
        self.hashes = {k: d.structure().content_hash() for k, d in self.dags.items()}

    def get(self, dag_id: str, version_hash: str) -> Dag:
        """Return the DAG, re-importing its file if the code on disk changed since it was loaded."""
        if self.hashes.get(dag_id) != version_hash:
            current = self.dags.get(dag_id)
            if current is not None and current.fileloc:
                for d in load_file(Path(current.fileloc), time_limit_s=self.file_limit_s)[0]:
                    self.dags[d.dag_id] = d
                    self.hashes[d.dag_id] = d.structure().content_hash()
            if self.hashes.get(dag_id) != version_hash:
                self.reload_all()
        found = self.dags.get(dag_id)
        if found is None:
            raise LookupError(f"DAG {dag_id!r} is not defined in {self.folder}")
        return found


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
    )


@contextlib.contextmanager
def _manifest_file(msg: Message) -> Iterator[str | None]:
    """Write the run manifest to a private JSON file, named in TREADLE_MANIFEST_FILE meanwhile."""
    manifest = msg.get("manifest")
    if not manifest:
        yield None
        return
    fd, path = tempfile.mkstemp(prefix=f"treadle-manifest-{msg['task_id']}-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(manifest, out, indent=2, sort_keys=True)
        previous = os.environ.get(MANIFEST_ENV)
        os.environ[MANIFEST_ENV] = path
        try:
            yield path
        finally:
            if previous is None:
                os.environ.pop(MANIFEST_ENV, None)
            else:
                os.environ[MANIFEST_ENV] = previous
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def run_task(cache: DagCache, msg: Message, *, max_result_bytes: int) -> Message:
    """Run one task callable from the DAG folder (see call_task)."""
    roots = (str(cache.folder.resolve()), str(cache.folder))
    try:
        dag = cache.get(msg["dag_id"], msg["version_hash"])
    except Exception as exc:
        return {"ok": False, **error_message(exc, user_roots=roots)}
    return call_task(dag, msg, max_result_bytes=max_result_bytes, user_roots=roots)


def call_task(dag: Dag, msg: Message, *, max_result_bytes: int, user_roots: tuple[str, ...]) -> Message:
    """Run one task callable; return {"ok": True, "value": ...} or an error description.

    A success reply also carries "outlet_events" (dataset -> {"version", "metadata"}) when the
    task annotated its outlet events through `context.outlet_event`.
    """
    roots = user_roots
    context: TaskContext | None = None
    try:
        node = dag.tasks.get(msg["task_id"])
        if node is None:
            raise LookupError(f"task {msg['task_id']!r} is not defined in DAG {dag.dag_id!r}")
        kwargs: dict[str, Any] = dict(msg.get("kwargs") or {})
        with _manifest_file(msg) as manifest_path:
            if node.takes_context:
                context = _context(msg, manifest_path)
                kwargs["context"] = context
            value = node.fn(*(msg.get("args") or []), **kwargs)
    except Exception as exc:
        return {"ok": False, **error_message(exc, user_roots=roots)}
    except BaseException as exc:  # SystemExit from user code ends the attempt, not the child
        return {"ok": False, **error_message(exc, user_roots=roots)}
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
            "ResultTooLarge", f"result is {len(encoded)} bytes; the limit is {max_result_bytes}"
        )
    reply: Message = {"ok": True, "value": value}
    if context is not None and context.outlet_events:
        problem = _outlet_events_problem(context.outlet_events)
        if problem is not None:
            return problem
        reply["outlet_events"] = context.outlet_events
    return reply


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
    }


def run_callback(cache: DagCache, msg: Message) -> Message:
    """Run an on_retry / on_dead_letter callback from the DAG folder (see call_callback)."""
    try:
        dag = cache.get(msg["dag_id"], msg["version_hash"])
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


def _die_with_worker() -> None:
    """Linux: when the worker dies (even by SIGKILL) the kernel sends SIGTERM, and the child kills
    its whole group, so an attempt never runs on beside its retry elsewhere (F1)."""
    signal.signal(signal.SIGTERM, lambda _sig, _frame: os.killpg(0, signal.SIGKILL))
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:  # it died before the request took effect
        os.killpg(0, signal.SIGKILL)


def child_main(
    conn: Connection,
    folder: str,
    max_result_bytes: int,
    file_limit_s: float | None = None,
    skip: list[str] | None = None,
) -> None:
    """Entry point of a child: own process group, load DAGs (each file within `file_limit_s`,
    none of `skip`), serve requests until EOF."""
    os.setsid()  # a timeout kills this child's whole group, grandchildren included
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_worker()
    become_subreaper()
    cache = DagCache(Path(folder), file_limit_s=file_limit_s, skip=skip or ())
    send(conn, {"ready": True})
    while True:
        try:
            msg = receive(conn)
        except (EOFError, OSError):
            return
        if msg["kind"] == "run":
            reply = run_task(cache, msg, max_result_bytes=max_result_bytes)
        else:
            reply = run_callback(cache, msg)
        kill_stray_processes()  # nothing a task started outlives its attempt (containment.py)
        send(conn, reply)
