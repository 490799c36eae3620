"""Identifier rule shared by DAG ids, task ids and run ids."""

from __future__ import annotations

import re

IDENTIFIER = re.compile(r"^[A-Za-z0-9._-]{1,250}$")


def is_identifier(value: str) -> bool:
    """Return True if `value` may be used as an id (letters, digits, `.`, `_`, `-`; 1-250)."""
    return bool(IDENTIFIER.match(value))


#: Dataset names may be URIs (`s3://bucket/key`, `warehouse.sales_daily`): no spaces or controls.
DATASET_NAME = re.compile(r"^[A-Za-z0-9._~:/?#@!$&'()*+,;=%-]{1,500}$")


def is_dataset_name(value: str) -> bool:
    """Return True if `value` may name a dataset (1-500 URI characters, no spaces)."""
    return bool(DATASET_NAME.match(value))
