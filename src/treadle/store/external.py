"""Queries on databases other than treadle's own (the SQL sensor): one short connection each."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from treadle.domain.urls import parse_database_url
from treadle.errors import ConfigError
from treadle.store.database import Database


def first_value(
    url: str, query: str, parameters: Mapping[str, Any] | None = None, *, timeout_s: float = 30.0
) -> Any:
    """The first column of the first row `query` returns on the database at `url` (None: no row).

    Bound parameters only (`:name` in the query): no value is ever formatted into the SQL. On the
    databases treadle runs on, the statement is bounded by `timeout_s` as treadle's own are (a
    ConfigError naming the extra when their driver is not installed); any other SQLAlchemy URL
    is used as it is.
    """
    try:
        parse_database_url(url)
    except ConfigError:
        engine = sa.create_engine(url, poolclass=NullPool)
        try:
            with engine.connect() as conn:
                row = conn.execute(sa.text(query), dict(parameters or {})).first()
        finally:
            engine.dispose()
        return None if row is None else row[0]
    db = Database(url, application_name="treadle-sql-sensor", pool_size=1, statement_timeout_s=timeout_s)
    try:
        with db.read() as conn:
            row = conn.execute(sa.text(query), dict(parameters or {})).first()
    finally:
        db.dispose()
    return None if row is None else row[0]
