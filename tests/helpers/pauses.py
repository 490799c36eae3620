"""Deterministic interleavings: pause one thread right after a named store call returns.

`Pause(monkeypatch, module, "function")` wraps a store function (the database stays real); the
thread started with `pause.run(fn)` stops after its first call of it, until `release()`. Other
threads call the real function untouched, so the test can commit a competing transaction in
exactly the gap between the paused thread's read and its write.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest


class Pause:
    """One pause point in one thread."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, module: ModuleType, name: str) -> None:
        self.reached = threading.Event()
        self._release = threading.Event()
        self._thread: threading.Thread | None = None
        self.result: Any = None
        self.error: BaseException | None = None
        original = getattr(module, name)

        def paused(*args: Any, **kwargs: Any) -> Any:
            value = original(*args, **kwargs)
            if threading.current_thread() is self._thread and not self.reached.is_set():
                self.reached.set()
                if not self._release.wait(60):
                    raise TimeoutError("pause was never released")
            return value

        monkeypatch.setattr(module, name, paused)

    def run(self, fn: Callable[[], Any]) -> None:
        """Start `fn` in the thread that pauses; wait until it reached the pause point."""

        def target() -> None:
            try:
                self.result = fn()
            except BaseException as exc:
                self.error = exc

        self._thread = threading.Thread(target=target, daemon=True)
        self._thread.start()
        if not self.reached.wait(30):
            raise AssertionError(f"the paused thread never reached the pause point (error: {self.error!r})")

    def release(self) -> Any:
        """Let the paused thread go on; wait for it and return what it returned (or raise)."""
        self._release.set()
        assert self._thread is not None
        self._thread.join(60)
        assert not self._thread.is_alive(), "the paused thread did not finish"
        if self.error is not None:
            raise self.error
        return self.result


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run `fn` in a thread; the dict gets "result" or "error" when it ends."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box
