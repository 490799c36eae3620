"""Alembic migrations of the treadle schema (one chain)."""
