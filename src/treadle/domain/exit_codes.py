"""The exit-code contract: what each exit code of a job (or exception of a Python task) means.

A job tells the orchestrator how it ended through its exit code. Four classes:

- success: the attempt succeeded;
- retryable: the attempt failed and may be tried again (source not ready, sink write failed);
- non_retryable: trying again cannot help (configuration, contract violation, bug): the task
  is dead-lettered at once;
- unknown_commit: the job may have committed part of its output; nobody can tell without
  looking, so the task instance waits in `needs_inspection` for an operator.

Pure data: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Disposition(StrEnum):
    """What an attempt's ending means for its task instance."""

    SUCCESS = "success"
    RETRYABLE = "retryable"
    NON_RETRYABLE = "non_retryable"
    UNKNOWN_COMMIT = "unknown_commit"


#: The conventional codes of the standard contract (`ExitContract.standard()`).
SOURCE_NOT_READY = 20
SINK_WRITE_FAILED = 50
CONFIGURATION_ERROR = 10
CONTRACT_VIOLATION = 30
QUALITY_PRECHECK_FAILED = 40
BUG = 70
UNKNOWN_COMMIT = 60

_MIN_CODE, _MAX_CODE = 0, 255


@dataclass(frozen=True, slots=True)
class ExitContract:
    """A mapping from exit codes to dispositions; codes not listed take `default`.

    The default contract (`ExitContract()`) is the plain Unix one: 0 succeeds, anything else is
    retryable. `ExitContract.standard()` adds the conventional classes of data jobs.
    """

    success: frozenset[int] = frozenset({0})
    retryable: frozenset[int] = frozenset()
    non_retryable: frozenset[int] = frozenset()
    unknown_commit: frozenset[int] = frozenset()
    default: Disposition = Disposition.RETRYABLE

    def __post_init__(self) -> None:
        seen: dict[int, str] = {}
        for name in ("success", "retryable", "non_retryable", "unknown_commit"):
            for code in getattr(self, name):
                if not isinstance(code, int) or isinstance(code, bool) or not _MIN_CODE <= code <= _MAX_CODE:
                    raise ValueError(f"exit code {code!r} in {name} is not an integer in 0..255")
                if code in seen:
                    raise ValueError(f"exit code {code} is listed as both {seen[code]} and {name}")
                seen[code] = name
        if not isinstance(self.default, Disposition):
            raise ValueError(f"default must be a Disposition, got {self.default!r}")

    @staticmethod
    def standard() -> ExitContract:
        """0 success; 20 (source not ready) and 50 (sink write failed) retryable; 10
        (configuration), 30 (contract violation), 40 (quality precheck) and 70 (bug)
        non-retryable; 60 unknown commit; any other code retryable."""
        return ExitContract(
            retryable=frozenset({SOURCE_NOT_READY, SINK_WRITE_FAILED}),
            non_retryable=frozenset({CONFIGURATION_ERROR, CONTRACT_VIOLATION, QUALITY_PRECHECK_FAILED, BUG}),
            unknown_commit=frozenset({UNKNOWN_COMMIT}),
        )

    @staticmethod
    def of(
        *,
        success: Iterable[int] = (0,),
        retryable: Iterable[int] = (),
        non_retryable: Iterable[int] = (),
        unknown_commit: Iterable[int] = (),
        default: str = Disposition.RETRYABLE.value,
    ) -> ExitContract:
        """Build a contract from lists of codes (what a DAG author writes)."""
        try:
            disposition = Disposition(default)
        except ValueError:
            allowed = ", ".join(d.value for d in Disposition)
            raise ValueError(f"default must be one of {allowed}, got {default!r}") from None
        return ExitContract(
            success=frozenset(success),
            retryable=frozenset(retryable),
            non_retryable=frozenset(non_retryable),
            unknown_commit=frozenset(unknown_commit),
            default=disposition,
        )

    def classify(self, code: int) -> Disposition:
        """The disposition of an attempt that ended with exit code `code`."""
        if code in self.success:
            return Disposition.SUCCESS
        if code in self.unknown_commit:
            return Disposition.UNKNOWN_COMMIT
        if code in self.non_retryable:
            return Disposition.NON_RETRYABLE
        if code in self.retryable:
            return Disposition.RETRYABLE
        return self.default

    @property
    def is_default(self) -> bool:
        """True for the plain contract (0 success, anything else retryable)."""
        return self == PLAIN_EXIT_CONTRACT

    def to_json(self) -> dict[str, Any]:
        """The JSON form (sorted lists)."""
        return {
            "success": sorted(self.success),
            "retryable": sorted(self.retryable),
            "non_retryable": sorted(self.non_retryable),
            "unknown_commit": sorted(self.unknown_commit),
            "default": self.default.value,
        }

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> ExitContract:
        """Build from the JSON form."""
        return ExitContract.of(
            success=data.get("success", (0,)),
            retryable=data.get("retryable", ()),
            non_retryable=data.get("non_retryable", ()),
            unknown_commit=data.get("unknown_commit", ()),
            default=data.get("default", Disposition.RETRYABLE.value),
        )

    def describe(self) -> str:
        """One line for people: which codes mean what."""
        parts = [f"{', '.join(map(str, sorted(self.success)))} success"]
        for name in ("retryable", "non_retryable", "unknown_commit"):
            codes = sorted(getattr(self, name))
            if codes:
                parts.append(f"{', '.join(map(str, codes))} {name.replace('_', '-')}")
        parts.append(f"other codes {self.default.value.replace('_', '-')}")
        return "; ".join(parts)


#: The plain contract (`ExitContract()`), built once: a contract is immutable, so every task that
#: sets no exit codes shares it (a DAG sync builds and compares tens of thousands).
PLAIN_EXIT_CONTRACT = ExitContract()
