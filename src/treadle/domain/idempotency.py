"""Idempotency-Key values: which keys are accepted, the key a claim is stored under, and the
fingerprint a reuse must match (pure: hashing only)."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from treadle.errors import InvalidRequest

#: The request header (draft-ietf-httpapi-idempotency-key-header).
HEADER = "Idempotency-Key"
#: What a key may be: 1-255 visible ASCII characters (a UUID, a ULID, a client's own id...).
KEY_PATTERN = r"^[\x21-\x7e]{1,255}$"
_KEY = re.compile(KEY_PATTERN)


@dataclass(frozen=True, slots=True, kw_only=True)
class IdempotentRequest:
    """A request carrying an Idempotency-Key: where its claim is stored and what it asks."""

    #: sha256 of (caller, route, key): a key is the caller's own, per route.
    key_hash: str
    #: sha256 of (method, path, body): what a reuse of the key must ask again.
    fingerprint: str
    #: "POST /api/v1/dags/x/runs", named when the key is reused for another request.
    request_line: str
    #: The key as sent (for messages).
    key: str
    #: How long the key's response is kept for retries.
    retention: timedelta


def idempotent_request(
    *,
    key: str,
    identity: str,
    route: str,
    method: str,
    path: str,
    body: Any,  # Any: the request's JSON body, as validated
    retention: timedelta,
) -> IdempotentRequest:
    """The claim of `key` sent by `identity` to `route` (its path template) with this request.

    Raises InvalidRequest naming the header when the key is not 1-255 visible ASCII characters.
    """
    if not _KEY.match(key):
        raise InvalidRequest(f"{HEADER}: must be 1 to 255 visible ASCII characters, got {key[:80]!r}")
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return IdempotentRequest(
        key_hash=_sha256(identity, route, key),
        fingerprint=_sha256(method.upper(), path, canonical),
        request_line=f"{method.upper()} {path}",
        key=key,
        retention=retention,
    )


def _sha256(*parts: str) -> str:
    digest = hashlib.sha256()
    for part in parts:
        encoded = part.encode()
        # Length-prefixed, so ("ab", "c") and ("a", "bc") differ.
        digest.update(len(encoded).to_bytes(8, "big") + encoded)
    return digest.hexdigest()
