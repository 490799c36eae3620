"""Memory of process trees, sampled from Linux /proc while a benchmark runs.

Three sums per sample, each over every live process of the trees: RSS (resident pages, shared
ones counted once per process that maps them, so the sum overstates), PSS (shared pages divided
among the processes that map them: the sum is what the trees take together) and USS (pages no
other process maps: what would be freed if the trees ended). All three come from one read of
`/proc/PID/smaps_rollup` per process.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(slots=True)
class Footprint:
    """Memory of some processes, in kB."""

    rss_kb: int = 0
    pss_kb: int = 0
    uss_kb: int = 0
    processes: int = 0

    def add(self, other: Footprint) -> None:
        """Add another footprint to this one."""
        self.rss_kb += other.rss_kb
        self.pss_kb += other.pss_kb
        self.uss_kb += other.uss_kb
        self.processes += other.processes

    def as_mb(self) -> dict[str, float | int]:
        """The figures in MB (rounded to 0.1), with the process count."""
        return {
            "rss_mb": round(self.rss_kb / 1024, 1),
            "pss_mb": round(self.pss_kb / 1024, 1),
            "uss_mb": round(self.uss_kb / 1024, 1),
            "processes": self.processes,
        }


def parse_smaps_rollup(text: str) -> Footprint:
    """RSS, PSS and USS (Private_Clean + Private_Dirty) of one process from its smaps_rollup."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("Rss", "Pss", "Private_Clean", "Private_Dirty"):
            values[key] = int(rest.split()[0])
    return Footprint(
        rss_kb=values.get("Rss", 0),
        pss_kb=values.get("Pss", 0),
        uss_kb=values.get("Private_Clean", 0) + values.get("Private_Dirty", 0),
        processes=1,
    )


def footprint(pid: int) -> Footprint:
    """Memory of one live process (an empty footprint if it is gone or unreadable)."""
    try:
        return parse_smaps_rollup(Path(f"/proc/{pid}/smaps_rollup").read_text())
    except (OSError, ValueError, IndexError):
        return Footprint()


def children_by_parent() -> dict[int, list[int]]:
    """Every live process id, grouped by its parent's id (a scan of /proc)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(raw[raw.rindex(")") + 2 :].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    return parents


def children(pid: int) -> list[int] | None:
    """The children of a process from its threads' `children` files (cheap), or None where the
    kernel has no such file."""
    found: list[int] = []
    try:
        threads = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return []
    for thread in threads:
        try:
            found.extend(int(c) for c in (thread / "children").read_text().split())
        except FileNotFoundError:
            if not (thread / "stat").exists():
                continue  # the thread ended meanwhile
            return None
        except (OSError, ValueError):
            continue
    return found


def descendants(roots: list[int], parents: dict[int, list[int]] | None = None) -> list[int]:
    """The live processes among `roots` and all their descendants."""
    found: list[int] = []
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid in found or not Path(f"/proc/{pid}").exists():
            continue
        found.append(pid)
        below = children(pid) if parents is None else parents.get(pid, [])
        if below is None:  # no children files: fall back to one scan of /proc
            parents = children_by_parent()
            below = parents.get(pid, [])
        todo.extend(below)
    return found


@dataclass(slots=True)
class Peak:
    """The highest sums seen, each at its own moment, and the split by tree at the PSS peak."""

    rss_kb: int = 0
    pss_kb: int = 0
    uss_kb: int = 0
    processes_at_pss_peak: int = 0
    by_tree_at_pss_peak: dict[str, Footprint] = field(default_factory=dict)
    samples: int = 0

    def take(self, by_tree: dict[str, Footprint]) -> None:
        """Fold one sample (a footprint per tree) into the peaks."""
        total = Footprint()
        for part in by_tree.values():
            total.add(part)
        self.samples += 1
        self.rss_kb = max(self.rss_kb, total.rss_kb)
        self.uss_kb = max(self.uss_kb, total.uss_kb)
        if total.pss_kb > self.pss_kb:
            self.pss_kb = total.pss_kb
            self.processes_at_pss_peak = total.processes
            self.by_tree_at_pss_peak = by_tree

    def figures(self) -> dict[str, Any]:
        """The peaks in MB, and each tree's share at the PSS peak."""
        return {
            "peak_rss_mb": round(self.rss_kb / 1024, 1),
            "peak_pss_mb": round(self.pss_kb / 1024, 1),
            "peak_uss_mb": round(self.uss_kb / 1024, 1),
            "peak_processes": self.processes_at_pss_peak,
            "at_pss_peak": {name: part.as_mb() for name, part in self.by_tree_at_pss_peak.items()},
            "memory_samples": self.samples,
        }


class MemorySampler(threading.Thread):
    """Samples the memory of named process trees (a root pid and its descendants) until stopped.

    A sample reads one smaps_rollup per process, which costs the kernel a walk of its page
    tables: a few ms of CPU each, so once a second keeps the sampler's share of a core small.
    """

    def __init__(self, roots: dict[str, int], every_s: float = 1.0) -> None:
        super().__init__(name="treadle-bench-memory", daemon=True)
        self.roots, self.every_s = roots, every_s
        self.peak = Peak()
        self._halt = threading.Event()

    def sample(self) -> dict[str, Footprint]:
        """One reading: the footprint of each tree."""
        by_tree: dict[str, Footprint] = {}
        for name, root in self.roots.items():
            part = Footprint()
            for pid in descendants([root]):
                part.add(footprint(pid))
            by_tree[name] = part
        return by_tree

    def run(self) -> None:
        while True:
            self.peak.take(self.sample())
            if self._halt.wait(self.every_s):
                return

    def stop(self) -> dict[str, Any]:
        """End the sampling and return the peaks."""
        self._halt.set()
        self.join(timeout=10)
        return self.peak.figures()
