"""Error fingerprints: group dead letters that fail for the same reason at the same place."""

from __future__ import annotations

import hashlib
import re

_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (
        re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"),
        "<uuid>",
    ),
    (re.compile(r"\b(?:manual|scheduled|backfill|dataset)__[A-Za-z0-9._-]+"), "<run_id>"),
    (re.compile(r"0x[0-9a-fA-F]+"), "<hex>"),
    (re.compile(r"\b(?=[0-9a-fA-F]*\d)[0-9a-fA-F]{6,}\b"), "<hex>"),
    (re.compile(r"'[^']*'|\"[^\"]*\""), "<str>"),
    (re.compile(r"\d+(\.\d+)?"), "<n>"),
    (re.compile(r"\s+"), " "),
]


def normalise_message(message: str) -> str:
    """Replace the parts of an error message that vary between occurrences (ids, numbers)."""
    text = message.strip().splitlines()[0] if message.strip() else ""
    for pattern, repl in _PATTERNS:
        text = pattern.sub(repl, text)
    return text[:300]


def fingerprint(error_type: str, message: str, frame: str) -> str:
    """Return a short stable fingerprint of (error type, normalised message, innermost user frame)."""
    key = "\x1f".join([error_type, normalise_message(message), frame])
    return hashlib.sha1(key.encode(), usedforsecurity=False).hexdigest()[:12]
