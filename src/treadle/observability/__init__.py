"""Structured logging (and, later, metrics) for every treadle process."""
