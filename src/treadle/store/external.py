"""Queries on databases other than treadle's own (the SQL sensor): one short connection each."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from treadle.errors import TreadleError
from treadle.store.database import normalise_url


def first_value(
    url: str, query: str, parameters: Mapping[str, Any] | None = None, *, timeout_s: float = 30.0
) -> Any:
    """The first column of the first row `query` returns on the database at `url` (None: no row).

    Bound parameters only (`:name` in the query): no value is ever formatted into the SQL.
    """
    try:  # the URLs treadle itself takes get its bundled drivers; any other goes as it is
        url = normalise_url(url)
    except TreadleError:
        pass
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            if conn.dialect.name == "postgresql":
                conn.exec_driver_sql(f"SET statement_timeout = {int(timeout_s * 1000)}")
            row = conn.execute(sa.text(query), dict(parameters or {})).first()
    finally:
        engine.dispose()
    return None if row is None else row[0]
