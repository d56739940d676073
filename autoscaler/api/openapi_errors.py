"""Make the OpenAPI document tell the truth about errors.

Every error this API returns is `{"detail": "<message>"}` (see `app.py`), but
FastAPI documents 422 as its own `HTTPValidationError` list and no other error at
all. Clients generated from the spec, and schemathesis, would then reject real
answers. This rewrites the generated document once: one `Error` schema, used for
422 and for every other 4xx/5xx an operation can return.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"detail": {"type": "string", "description": "What went wrong, for a person to read."}},
    "required": ["detail"],
    "title": "Error",
}
_ERROR_RESPONSE = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
_DOCUMENTED = {
    "422": "Invalid request: every offending field is named.",
    "4XX": "Client error: missing or bad token (401), not allowed (403), not found (404), conflict (409), "
    "body too large (413), too many failed authentications (429).",
    "503": "The database is unavailable; retry with backoff.",
}


def document_errors(app: FastAPI) -> None:
    """Install an `openapi()` on `app` that documents the real error shape."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = get_openapi(title=app.title, version=app.version, routes=app.routes)
            schemas = spec.setdefault("components", {}).setdefault("schemas", {})
            schemas.pop("HTTPValidationError", None)
            schemas.pop("ValidationError", None)
            schemas["Error"] = ERROR_SCHEMA
            for path in spec.get("paths", {}).values():
                for operation in path.values():
                    responses = operation.setdefault("responses", {})
                    for code, description in _DOCUMENTED.items():
                        responses[code] = {"description": description, **_ERROR_RESPONSE}
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
