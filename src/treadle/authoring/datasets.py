"""`Dataset`: a named piece of data that tasks produce (outlets) and DAGs wait for (schedule)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from treadle.domain.identifiers import is_dataset_name
from treadle.errors import DagDefinitionError


@dataclass(frozen=True, slots=True)
class Dataset:
    """A dataset (asset), named by a URI-like string such as `warehouse.sales_daily`.

    A task with `outlets=[Dataset(...)]` records an event on the dataset each time it succeeds;
    a DAG with `schedule=[Dataset(...), ...]` runs once every one of its datasets has a new event.
    """

    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not is_dataset_name(self.name):
            raise DagDefinitionError(
                f"dataset name {self.name!r} must be 1-500 URI characters without spaces"
            )


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
