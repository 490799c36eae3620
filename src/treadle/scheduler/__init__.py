"""Scheduler process: drives time-based transitions (due retries, expired leases, run completion)."""
