"""Posted HTML forms: the fields of an application/x-www-form-urlencoded body."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import parse_qs

from fastapi import Depends, Request

from treadle.api.sessions import CSRF_FORM_FIELD
from treadle.errors import InvalidRequest


class Form:
    """The fields of a posted form (the CSRF field, which the guard checked, left out)."""

    def __init__(self, fields: dict[str, list[str]]) -> None:
        self._fields = fields

    def get(self, name: str, default: str = "") -> str:
        """The field's (first) value, stripped; `default` when absent."""
        values = self._fields.get(name)
        return values[0].strip() if values else default

    def raw(self, name: str) -> str:
        """The field's (first) value exactly as posted (passwords are not stripped)."""
        values = self._fields.get(name)
        return values[0] if values else ""

    def all(self, name: str) -> list[str]:
        """Every value of a repeated field."""
        return [v.strip() for v in self._fields.get(name, [])]

    def items(self) -> list[tuple[str, str]]:
        """(name, first value) of every field."""
        return [(k, v[0]) for k, v in self._fields.items() if v]

    def has(self, name: str) -> bool:
        """True if the form posted the field."""
        return name in self._fields


async def read_form(request: Request) -> Form:
    """The posted form; InvalidRequest for another body type."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    body = await request.body()
    if body and kind != "application/x-www-form-urlencoded":
        raise InvalidRequest("post this page's form (application/x-www-form-urlencoded)")
    fields = parse_qs(body.decode("utf-8", errors="replace"), keep_blank_values=True)
    fields.pop(CSRF_FORM_FIELD, None)
    return Form(fields)


Posted = Annotated[Form, Depends(read_form)]
