"""Delivery of outbox entries to the outside world: the leader's relay and its sinks."""
