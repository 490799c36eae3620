"""The `Idempotency-Key` header of the routes that create things (engine/idempotency.py decides).

A route takes the header as `IdempotencyKey` and answers through `answer_once`: without a key it
answers as usual; with one, a retry by the same caller gets the first response back (with
`Idempotent-Replayed: true`) and the change is made once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import timedelta
from typing import Annotated, Any, TypeVar

from fastapi import Header, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, TypeAdapter

from treadle.api.guard import Caller
from treadle.api.settings import ApiSettings
from treadle.domain.idempotency import HEADER, KEY_PATTERN, idempotent_request
from treadle.engine import idempotency
from treadle.engine.idempotency import ExpiredKeys
from treadle.store.database import Database

T = TypeVar("T")
#: The response header marking a recorded answer given again.
REPLAYED_HEADER = "Idempotent-Replayed"

IdempotencyKey = Annotated[
    str | None,
    Header(
        alias=HEADER,
        min_length=1,
        max_length=255,
        pattern=KEY_PATTERN,
        description=(
            "Send the same key again to retry safely: the first response comes back and nothing "
            "is done twice. A key is the caller's own, per route, kept TREADLE_API_IDEMPOTENCY_HOURS; "
            "reusing it for a different request is a 422."
        ),
    ),
]

#: The responses a route with the header may give besides its own (for the OpenAPI document).
RESPONSES: dict[int | str, dict[str, Any]] = {
    409: {"description": "A request with this Idempotency-Key has not answered yet: retry later"},
    422: {"description": "Invalid request, or an Idempotency-Key reused for a different request"},
}


def answer_once(
    request: Request,
    caller: Caller,
    *,
    key: str | None,
    body: BaseModel | None,
    status_code: int,
    model: Any,  # Any: the route's response model (a type)
    make: Callable[[], T],
) -> T | JSONResponse:
    """`make()`'s result, or, with a key, the key's recorded response (making it the first time)."""
    if key is None:
        return make()
    db: Database = request.app.state.db
    settings: ApiSettings = request.app.state.api_settings
    route = request.scope.get("route")
    claim = idempotent_request(
        key=key,
        identity=caller.principal.actor,
        route=str(getattr(route, "path", request.url.path)),
        method=request.method,
        path=request.url.path,
        body=body.model_dump(mode="json") if body is not None else None,
        retention=timedelta(hours=settings.idempotency_hours),
    )
    expired: ExpiredKeys = request.app.state.expired_keys
    expired.prune_if_due(db)
    adapter = _adapter(model)
    answer = idempotency.respond_once(
        db,
        claim,
        make=make,
        answer=lambda result: (status_code, adapter.dump_python(result, mode="json")),
        result_type=model if isinstance(model, type) else None,
    )
    headers = {REPLAYED_HEADER: "true"} if answer.replayed else None
    return JSONResponse(answer.body, status_code=answer.status_code, headers=headers)


@functools.cache
def _adapter(model: Any) -> TypeAdapter[Any]:  # Any: any response model
    return TypeAdapter(model)
