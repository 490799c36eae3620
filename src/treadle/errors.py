"""The one error tree of treadle.

TreadleError
├── ConfigError            a setting is missing or invalid (names the setting)
│   └── SettingOutOfRange  a numeric setting is not finite or outside its range (setting, value, allowed)
├── DagDefinitionError     a DAG is malformed: cycle, unknown or duplicate task id, bad setting
├── DagNotFound            no DAG with that id is registered
├── RunNotFound            no run with that id
├── TaskInstanceNotFound   no task instance with that id
├── AttemptLogMissing      an attempt's log file is not on this host (path, hostname)
├── InvalidRequest         input from a user that cannot be accepted (names the problem)
│   ├── ParamsInvalid      a trigger's conf breaks the DAG's params schema or rules (dag_id, violations)
│   ├── RunNotAllowed      the DAG's contract refuses this kind of run (dag_id, run_kind, setting)
│   ├── DagInactive        the DAG's file is gone or no longer defines it (dag_id, fileloc)
│   └── RunCancelledError  a requeue would run work in a cancelled run (run_id, task_id)
├── ClearConflict          task instances moved while a clear read them (run_id; nothing applied)
├── NotLeader              the leader lease is lost: the caller stands down (holder, epoch)
├── WatermarkMoved         a schedule's watermark moved under a firing pass (dag_ids, expected, moved)
├── MarksMoved             a dataset consumption mark moved under a trigger pass (dag_ids, expected, moved)
├── BackfillConflict       a backfill changed under a drain pass or an operator action (backfill_id, dag_id)
├── SchemaOutOfDate        the database schema is not at the code's revision
│   └── SchemaTooNew       the database is at a revision newer than this code knows (revision, expected)
├── DatabaseUnavailable    the database cannot be reached (after retries)
├── NotAuthenticated       no valid credentials: no session or token, a wrong password, a revoked token
├── PermissionDenied       the caller's role in the object's team does not allow the action
│   └── PasswordChangeRequired  the account must change its password before anything else
├── TooManyAttempts        too many failed logins for a user or from an address (retry_after_s)
├── Overloaded             admission control refused new work: a queued limit (setting, limit, retry_after_s)
├── AccountNotFound        no user, team or token by that name or id
├── AccountConflict        a user or team by that name exists already
├── IdempotencyKeyReused   an Idempotency-Key sent again with a different request
└── IdempotencyKeyInProgress  the request that claimed an Idempotency-Key has not answered (retry_after_s)

The classes with facts take them as keyword-only fields, kept as attributes; their message is
built from those fields unless one is given.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

#: Most violations spelled out in a ParamsInvalid message; all are kept in `violations`.
MAX_LISTED_VIOLATIONS = 100


class TreadleError(Exception):
    """A treadle operation failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or type(self).__name__).strip())


class ConfigError(TreadleError):
    """A setting is missing or invalid."""


class SettingOutOfRange(ConfigError):
    """A numeric setting is not a finite number within its allowed range."""

    def __init__(self, message: str | None = None, *, setting: str, value: float, allowed: str) -> None:
        #: The environment variable at fault.
        self.setting = setting
        self.value = value
        #: The allowed values in words, e.g. "a number of seconds in 1..3600".
        self.allowed = allowed
        super().__init__(message or f"{setting} must be {allowed}, got {value}")


class DagDefinitionError(TreadleError):
    """The DAG definition is invalid."""


class DagNotFound(TreadleError):
    """No DAG with that id is registered."""


class RunNotFound(TreadleError):
    """No run with that id exists."""


class TaskInstanceNotFound(TreadleError):
    """No task instance with that id exists."""


class AttemptLogMissing(TreadleError):
    """The attempt's log file is not on this host."""

    def __init__(self, message: str | None = None, *, path: str, hostname: str | None) -> None:
        #: Where the file was looked for.
        self.path = path
        #: The host of the worker that ran the attempt (None: not recorded).
        self.hostname = hostname
        super().__init__(message)


class InvalidRequest(TreadleError):
    """The request cannot be accepted."""


class Violation(Protocol):
    """One problem found in a conf (domain/params.py's ParamViolation)."""

    @property
    def path(self) -> str:
        """JSON path of the offending value."""

    @property
    def message(self) -> str:
        """What is wrong, in plain English."""


class ParamsInvalid(InvalidRequest):
    """A trigger's conf does not satisfy the DAG's params schema."""

    def __init__(self, message: str | None = None, *, dag_id: str, violations: Sequence[Violation]) -> None:
        self.dag_id = dag_id
        self.violations: tuple[Violation, ...] = tuple(violations)
        super().__init__(message or self._describe())

    def _describe(self) -> str:
        n = len(self.violations)
        lines = [f"  {v.path}: {v.message}" for v in self.violations[:MAX_LISTED_VIOLATIONS]]
        if n > MAX_LISTED_VIOLATIONS:
            lines.append(f"  ... and {n - MAX_LISTED_VIOLATIONS} more")
        return f"params of dag {self.dag_id!r} are invalid ({n} problem(s)):\n" + "\n".join(lines)


class RunNotAllowed(InvalidRequest):
    """The DAG's contract does not allow this kind of run."""

    def __init__(
        self, message: str | None = None, *, dag_id: str, run_kind: str, setting: str, owner: str = ""
    ) -> None:
        self.dag_id = dag_id
        #: What was refused, in words: "manual runs" or "backfills".
        self.run_kind = run_kind
        #: The contract setting that refuses it, e.g. "manual_runs".
        self.setting = setting
        self.owner = owner
        ask = f"; its owner is {owner!r}" if owner else ""
        super().__init__(
            message or f"DAG {dag_id!r} does not allow {run_kind}: its contract sets {setting}=False{ask}"
        )


class DagInactive(InvalidRequest):
    """The last sync of the DAG folder found the DAG's file gone or no longer defining it."""

    def __init__(self, message: str | None = None, *, dag_id: str, fileloc: str) -> None:
        self.dag_id = dag_id
        #: The file the DAG was last registered from.
        self.fileloc = fileloc
        super().__init__(
            message
            or f"DAG {dag_id!r} is inactive: the last sync of the DAG folder found {fileloc or 'its file'} "
            "deleted or no longer defining it (its runs and history are kept); restore it and run "
            "`treadle dags sync` to make it active again"
        )


class NotLeader(TreadleError):
    """This scheduler no longer holds the leader lease at the epoch it acts under."""

    def __init__(self, message: str | None = None, *, holder: str, epoch: int) -> None:
        self.holder = holder
        self.epoch = epoch
        super().__init__(message or f"{holder} no longer leads at epoch {epoch}")


class WatermarkMoved(TreadleError):
    """A schedule's watermark changed under this pass (its DAG was re-registered meanwhile)."""

    def __init__(
        self, message: str | None = None, *, dag_ids: Sequence[str], expected: int, moved: int
    ) -> None:
        #: DAGs whose watermarks the pass meant to move (one of them changed).
        self.dag_ids = tuple(dag_ids)
        self.expected = expected
        self.moved = moved
        super().__init__(
            message or f"a schedule changed during the firing pass ({moved} of {expected} watermarks moved)"
        )


class MarksMoved(TreadleError):
    """A consumption mark changed under a trigger pass (it is rolled back and retried)."""

    def __init__(
        self, message: str | None = None, *, dag_ids: Sequence[str], expected: int, moved: int
    ) -> None:
        #: DAGs whose marks the pass meant to move (one of their marks changed).
        self.dag_ids = tuple(dag_ids)
        self.expected = expected
        self.moved = moved
        super().__init__(
            message
            or f"a dataset consumption mark changed during the trigger pass ({moved} of {expected} moved)"
        )


class BackfillConflict(TreadleError):
    """A backfill changed during a drain pass or an operator action (nothing was applied)."""

    def __init__(self, message: str | None = None, *, backfill_id: int, dag_id: str) -> None:
        self.backfill_id = backfill_id
        self.dag_id = dag_id
        super().__init__(message or f"backfill {backfill_id} of DAG {dag_id!r} changed meanwhile; try again")


class SchemaOutOfDate(TreadleError):
    """The database schema is not at the revision this code expects; run `treadle db upgrade`."""


class SchemaTooNew(SchemaOutOfDate):
    """The database was migrated by a newer treadle; upgrade treadle, do not downgrade the database."""

    def __init__(self, message: str | None = None, *, revision: str, expected: str) -> None:
        #: The revision the database is at (unknown to this code).
        self.revision = revision
        #: The newest revision this code knows.
        self.expected = expected
        super().__init__(
            message
            or f"database is at revision {revision}, newer than this treadle (expects {expected}): "
            "upgrade treadle, do not downgrade the database"
        )


class DatabaseUnavailable(TreadleError):
    """The database cannot be reached."""


class RunCancelledError(InvalidRequest):
    """The run was cancelled: work in it is not requeued; `treadle tasks clear` reopens it."""

    def __init__(self, message: str | None = None, *, run_id: str, task_id: str) -> None:
        self.run_id, self.task_id = run_id, task_id
        super().__init__(
            message
            or f"run {run_id!r} was cancelled, so task {task_id!r} is not requeued into it; to run it "
            f"again, reopen the run with `treadle tasks clear {run_id} {task_id}`"
        )


class ClearConflict(TreadleError):
    """Task instances of a run changed while they were being cleared (nothing was applied)."""

    def __init__(self, message: str | None = None, *, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(
            message or f"task instances of run {run_id!r} changed while being cleared; try again"
        )


class NotAuthenticated(TreadleError):
    """Sign in first: no valid session or API token was presented."""


class PermissionDenied(TreadleError):
    """Your role does not allow this action."""


class PasswordChangeRequired(PermissionDenied):
    """The password must be changed first: POST /api/v1/auth/password (or `treadle users set-password`)."""


class TooManyAttempts(TreadleError):
    """Too many failed logins: wait and try again."""

    def __init__(self, message: str | None = None, *, retry_after_s: int) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(message or f"too many failed logins; try again in {retry_after_s} s")


class Overloaded(TreadleError):
    """Refused: the work would exceed a limit on queued task instances; try again later."""

    def __init__(
        self,
        message: str | None = None,
        *,
        setting: str,
        limit: int,
        scope: str,
        name: str,
        queued: int,
        adding: int,
        retry_after_s: int,
    ) -> None:
        #: The setting holding the limit that was hit.
        self.setting = setting
        self.limit = limit
        #: "queue" or "dag", and the queue's or the DAG's name.
        self.scope = scope
        self.name = name
        #: Queued there now, and what the refused work would have added.
        self.queued = queued
        self.adding = adding
        self.retry_after_s = retry_after_s
        super().__init__(message or f"overloaded: {setting} ({limit}) would be exceeded in {scope} {name!r}")


class AccountNotFound(TreadleError):
    """No such user, team or token."""


class AccountConflict(TreadleError):
    """A user or team by that name exists already."""


class IdempotencyKeyReused(TreadleError):
    """This Idempotency-Key was used for a different request: send a new key for a new request."""


class IdempotencyKeyInProgress(TreadleError):
    """The request that claimed this Idempotency-Key has not answered yet; retry later."""

    def __init__(self, message: str | None = None, *, retry_after_s: int = 1) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(message)
