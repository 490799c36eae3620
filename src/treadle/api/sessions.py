"""Browser sessions: a signed cookie naming the user, the session version and a CSRF token.

Nothing of the session is stored server-side but the user's session version: a password or
role change, disabling or logging out bumps it, and every cookie issued before stops working
on every API process at once (S7).
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass

from itsdangerous import BadSignature, URLSafeTimedSerializer

SESSION_COOKIE = "treadle_session"
#: Readable by the page's script, which echoes it in the CSRF header (double submit).
CSRF_COOKIE = "treadle_csrf"
CSRF_HEADER = "x-csrf-token"
#: The field a posted HTML form of the web UI carries the CSRF token in (instead of the header).
CSRF_FORM_FIELD = "csrf_token"
#: The API and the web UI are one app on one origin: the cookies serve both.
COOKIE_PATH = "/"


@dataclass(frozen=True, slots=True, kw_only=True)
class Session:
    """What a session cookie carries."""

    user_id: int
    session_version: int
    csrf_token: str


class SessionCodec:
    """Signs and reads session cookies with the deployment's secret key."""

    def __init__(self, secret_key: str, *, max_age_s: float) -> None:
        self._serializer = URLSafeTimedSerializer(secret_key, salt="treadle.session")
        self.max_age_s = max_age_s

    def issue(self, *, user_id: int, session_version: int) -> tuple[str, Session]:
        """A new cookie value (with a fresh CSRF token) and the session it carries."""
        session = Session(
            user_id=user_id, session_version=session_version, csrf_token=secrets.token_urlsafe(24)
        )
        value = self._serializer.dumps([session.user_id, session.session_version, session.csrf_token])
        return value, session

    def read(self, value: str) -> Session | None:
        """The session of a cookie value; None if forged, expired or malformed."""
        try:
            data = self._serializer.loads(value, max_age=int(self.max_age_s))
        except BadSignature:
            return None
        if not (isinstance(data, list) and len(data) == 3):
            return None
        user_id, version, csrf = data
        if not (isinstance(user_id, int) and isinstance(version, int) and isinstance(csrf, str)):
            return None
        return Session(user_id=user_id, session_version=version, csrf_token=csrf)


def csrf_matches(session: Session, header_value: str | None) -> bool:
    """True if the request echoes the session's CSRF token (compared in constant time)."""
    return header_value is not None and hmac.compare_digest(session.csrf_token, header_value)
