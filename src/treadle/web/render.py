"""Rendering pages: the Jinja2 environment, the page CSP, formatting filters and the page context."""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ParamSpec
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

from treadle.api.guard import Caller
from treadle.api.problems import STATUS
from treadle.api.sessions import SESSION_COOKIE, SessionCodec
from treadle.domain.access import Action, is_allowed
from treadle.errors import TreadleError

HERE = Path(__file__).parent
#: Scripts and styles only from this origin's static files: no inline script, no inline style.
PAGE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
#: Every state a run or task instance can be in, in the legend's order.
STATES = (
    "success",
    "running",
    "queued",
    "pending",
    "scheduled",
    "retry_wait",
    "up_for_reschedule",
    "needs_inspection",
    "failed",
    "dead_letter",
    "upstream_failed",
    "skipped",
    "cancelled",
)

P = ParamSpec("P")


def duration(seconds: float | None) -> str:
    """Seconds as `850 ms`, `12.3 s`, `4 min 05 s`, `2 h 10 min`; an em dash for None."""
    if seconds is None:
        return "—"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"


def when(at: datetime | None, tz: str = "UTC") -> str:
    """A time in zone `tz` as `2026-12-01 14:05:09 UTC`."""
    if at is None:
        return "—"
    try:
        zone: Any = ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        zone = UTC
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return at.astimezone(zone).strftime(f"%Y-%m-%d %H:%M:%S {tz}")


def iso(at: datetime | None) -> str:
    """A time as ISO 8601 in UTC (for `<time datetime>`, which the page's script localises)."""
    if at is None:
        return ""
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return at.astimezone(UTC).isoformat()


def pretty_json(value: Any) -> str:  # Any: user JSON
    """JSON indented for reading."""
    return json.dumps(value, indent=2, sort_keys=True, default=str)


ENV = Environment(
    loader=FileSystemLoader(HERE / "templates"),
    autoescape=select_autoescape(["html"]),
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
ENV.filters.update(duration=duration, when=when, iso=iso, pretty_json=pretty_json)
ENV.globals.update(STATES=STATES)


@dataclass(frozen=True, slots=True, kw_only=True)
class Viewer:
    """The signed-in caller of a page: who, the CSRF token its forms carry, what it may do."""

    caller: Caller
    csrf: str

    @property
    def username(self) -> str:
        """The caller's user name."""
        return self.caller.principal.username

    def can(self, action: str, team: str | None = None) -> bool:
        """True if the caller may do the action (named like `Action`, e.g. "pause_dag") in `team`."""
        return is_allowed(self.caller.principal, Action[action.upper()], team=team)


def viewer(request: Request) -> Viewer:
    """The page's viewer (the guard has authenticated the caller)."""
    caller: Caller = request.state.caller
    codec: SessionCodec = request.app.state.codec
    cookie = request.cookies.get(SESSION_COOKIE)
    session = codec.read(cookie) if cookie else None
    return Viewer(caller=caller, csrf=session.csrf_token if session else "")


def page(
    request: Request, template: str, *, status: int = 200, title: str = "", **context: Any
) -> HTMLResponse:  # Any: template values
    """A page rendered from `template`, with the page CSP."""
    who = viewer(request) if getattr(request.state, "caller", None) is not None else None
    html = ENV.get_template(template).render(
        request=request, viewer=who, title=title, path=request.url.path, **context
    )
    return HTMLResponse(html, status_code=status, headers={"Content-Security-Policy": PAGE_CSP})


def fragment(template: str, **context: Any) -> HTMLResponse:  # Any: template values
    """A piece of a page (a live-refreshed region), with the page CSP."""
    html = ENV.get_template(template).render(**context)
    return HTMLResponse(html, headers={"Content-Security-Policy": PAGE_CSP})


def see_other(location: str) -> RedirectResponse:
    """Redirect after a form post (the browser then GETs `location`)."""
    return RedirectResponse(location, status_code=303)


def shown_errors(func: Callable[P, Any]) -> Callable[P, Any]:
    """Turn a treadle error of a page handler into an HTML error page with the error's status."""

    @functools.wraps(func)
    def wrapped(*args: P.args, **kwargs: P.kwargs) -> Any:
        try:
            return func(*args, **kwargs)
        except TreadleError as exc:
            request = next(a for a in [*args, *kwargs.values()] if isinstance(a, Request))
            status, heading = next((STATUS[c] for c in type(exc).__mro__ if c in STATUS), (500, "Error"))
            return page(
                request, "error.html", status=status, title=heading, heading=heading, message=str(exc)
            )

    # FastAPI reads the parameters from the signature; resolve the handler's string annotations
    # in its own module (the wrapper's globals are this module's).
    wrapped.__signature__ = inspect.signature(func, eval_str=True)  # type: ignore[attr-defined]
    return wrapped
