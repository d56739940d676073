"""Checks on raw requests that pydantic cannot make, run before routing.

NUL characters: PostgreSQL refuses U+0000 in text (the driver raises, which would
be a 500), SQLite stores it, and a NUL in a command or an environment variable
cannot be passed to `execve` on the agent anyway. Refusing them at the door gives
one clear 422 on both databases instead of a late failure on one.
"""

from __future__ import annotations

import json
from typing import Any

NUL_MESSAGE = "NUL characters (U+0000) are not allowed in requests"


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


def body_has_nul(body: bytes) -> bool:
    """True if the JSON body carries a NUL in any string. Decodes only when the escape is present."""
    if b"\x00" in body:
        return True
    if b"\\u0000" not in body:  # the only way JSON can spell a NUL; the common path stops here
        return False
    try:
        return _has_nul(json.loads(body))
    except (ValueError, RecursionError):
        return False  # not JSON: the validation that follows answers with its own 422


def target_has_nul(path: str, query_string: bytes) -> bool:
    """True if the (decoded) path or the query string carries a NUL."""
    return "\x00" in path or b"%00" in query_string or b"\x00" in query_string
