"""The state machine table: well formed, complete for its use cases, and the one in the docs."""

from __future__ import annotations

from pathlib import Path

import pytest

from treadle.domain.states import ACTIVE_TASK_STATES, TERMINAL_RUN_STATES, RunState, TaskState
from treadle.domain.transitions import (
    RUN_TRANSITIONS,
    TASK_TRANSITIONS,
    TransitionNotAllowed,
    UseCase,
    markdown_table,
    run_sources,
    task_sources,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def test_every_edge_names_real_states_and_no_edge_is_listed_twice() -> None:
    for table, states in ((TASK_TRANSITIONS, TaskState), (RUN_TRANSITIONS, RunState)):
        values = {s.value for s in states}
        for t in table:
            assert t.source in values and t.target in values, t
            # One self-edge: a clear resets a pending instance's upstream counter.
            assert t.source != t.target or (t.by, t.source) == (UseCase.CLEAR, "pending"), t
        keys = [(t.source, t.target, t.by) for t in table]
        assert len(keys) == len(set(keys))


def test_terminal_task_states_are_left_only_by_operator_reopeners() -> None:
    for t in TASK_TRANSITIONS:
        if t.source not in {s.value for s in ACTIVE_TASK_STATES}:
            assert t.by in (UseCase.REQUEUE, UseCase.CLEAR), t


def test_a_run_leaves_a_terminal_state_only_to_reopen() -> None:
    for t in RUN_TRANSITIONS:
        if t.source in {s.value for s in TERMINAL_RUN_STATES}:
            assert (t.by, t.target) == (UseCase.REOPEN, RunState.RUNNING.value), t


def test_sources_are_what_guarded_updates_expect() -> None:
    assert task_sources(UseCase.CLAIM, TaskState.RUNNING) == ("queued",)
    assert task_sources(UseCase.CANCEL, TaskState.CANCELLED) == tuple(
        sorted(s.value for s in ACTIVE_TASK_STATES)
    )
    assert run_sources(UseCase.CANCEL, RunState.CANCELLED) == ("queued", "running")
    assert run_sources(UseCase.REOPEN, RunState.RUNNING) == ("cancelled", "failed", "success")
    with pytest.raises(TransitionNotAllowed, match="complete never moves anything to 'queued'"):
        task_sources(UseCase.COMPLETE, TaskState.QUEUED)
    with pytest.raises(TransitionNotAllowed):
        run_sources(UseCase.CLOSE, RunState.CANCELLED)


def test_the_architecture_document_holds_the_table_generated_from_the_code() -> None:
    text = DOC.read_text()
    begin, end = "<!-- transitions:begin -->", "<!-- transitions:end -->"
    assert begin in text and end in text, "docs/architecture.md lost its transition table markers"
    documented = text.split(begin, 1)[1].split(end, 1)[0].strip()
    assert documented == markdown_table().strip(), (
        "docs/architecture.md's transition table differs from domain/transitions.py; "
        "paste the output of `python -c 'from treadle.domain.transitions import markdown_table as t; "
        "print(t())'` between the markers"
    )
