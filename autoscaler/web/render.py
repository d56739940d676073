"""Jinja2 templates (autoescaped) and the formatting filters the pages share."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi.responses import HTMLResponse
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from autoscaler.web.charts import sparkline

# An en dash for "no value", written as an escape so the source stays ASCII.
NONE = "\u2013"

_env = Environment(
    loader=PackageLoader("autoscaler.web", "templates"),
    autoescape=select_autoescape(["html"]),
    undefined=StrictUndefined,  # a template typo fails the tests instead of rendering blank
    trim_blocks=True,
    lstrip_blocks=True,
)


def duration(seconds: float | None) -> str:
    if seconds is None:
        return NONE
    s = int(max(seconds, 0))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def money(value: float | None) -> str:
    return NONE if value is None else f"${value:,.2f}"


def timestamp(value: datetime | None) -> str:
    return NONE if value is None else f"{value.astimezone(UTC):%Y-%m-%d %H:%M:%S}Z"


def percent(value: float | None) -> str:
    return NONE if value is None else f"{value * 100:.0f} %"


_env.filters.update(duration=duration, money=money, ts=timestamp, pct=percent)
_env.globals["sparkline"] = sparkline


def render(name: str, *, status: int = 200, **context: Any) -> HTMLResponse:
    html = _env.get_template(name).render(**context)
    return HTMLResponse(
        html,
        status_code=status,
        headers={
            # Pages show live state and per-viewer data: never cache them anywhere.
            "Cache-Control": "no-store",
            "X-Frame-Options": "DENY",
            "Content-Security-Policy": "default-src 'self'; style-src 'self'; img-src 'self' data:; "
            "script-src 'none'; frame-ancestors 'none'; form-action 'self'",
            "Referrer-Policy": "same-origin",
        },
    )
