"""`Dataset`: a named piece of data that tasks produce (outlets) and DAGs wait for (schedule)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta

from treadle.domain.alerts import duration_s
from treadle.domain.contract import MAX_FRESHNESS_S
from treadle.domain.freshness import DatasetSlo, Deadline
from treadle.domain.identifiers import is_dataset_name
from treadle.errors import DagDefinitionError


@dataclass(frozen=True, slots=True)
class Dataset:
    """A dataset (asset), named by a URI-like string such as `warehouse.sales_daily`.

    A task with `outlets=[Dataset(...)]` records an event on the dataset each time it succeeds;
    a DAG with `schedule=[Dataset(...), ...]` runs once every one of its datasets has a new event.

    A dataset may carry its own freshness SLOs, a maximum age (`freshness_slo="6h"`) and a daily
    deadline (`published_by="06:00 Asia/Jakarta"`), where a DAG lists it in its `outlets=`;
    they replace the DAG's own SLOs for that output.
    """

    name: str
    freshness_slo: timedelta | float | str | None = None
    published_by: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not is_dataset_name(self.name):
            raise DagDefinitionError(
                f"dataset name {self.name!r} must be 1-500 URI characters without spaces"
            )
        self.slo()  # validated here, at the declaration

    @property
    def has_slo(self) -> bool:
        """True when the dataset declares a freshness SLO of its own."""
        return self.freshness_slo is not None or self.published_by is not None

    def slo(self) -> DatasetSlo | None:
        """The stored form of its SLOs; DagDefinitionError naming the field at fault."""
        if not self.has_slo:
            return None
        where = f"dataset {self.name!r}"
        try:
            seconds = None
            if self.freshness_slo is not None:
                seconds = duration_s(self.freshness_slo, f"{where}: freshness_slo")
                if not 0 < seconds <= MAX_FRESHNESS_S:
                    raise ValueError(f"{where}: freshness_slo must be more than 0 s and at most 366 days")
            deadline = None if self.published_by is None else str(Deadline.parse(str(self.published_by)))
        except ValueError as exc:
            text = str(exc)
            raise DagDefinitionError(text if text.startswith(where) else f"{where}: {text}") from None
        return DatasetSlo(dataset=self.name, freshness_slo_s=seconds, published_by=deadline)


def dataset_names(values: Iterable[object], where: str) -> tuple[str, ...]:
    """Names of the given Datasets (or plain names), sorted and unique; raises naming a bad one."""
    names = set()
    for v in values:
        if isinstance(v, Dataset):
            names.add(v.name)
        elif isinstance(v, str):
            names.add(Dataset(v).name)
        else:
            raise DagDefinitionError(f"{where}: expected a Dataset, got {v!r}")
    return tuple(sorted(names))
