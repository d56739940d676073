"""Server-rendered SVG charts: a line chart of several series and a sparkline.

Pure functions from points to markup, so pages need no JavaScript and no build step.
Every label is escaped; numbers are formatted by us.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape

from markupsafe import Markup

# A palette readable on white and distinguishable for common colour blindness.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")
MAX_POINTS = 240


@dataclass(frozen=True)
class Series:
    name: str
    points: list[tuple[datetime, float]]


def _downsample(points: list[tuple[datetime, float]], limit: int = MAX_POINTS) -> list[tuple[datetime, float]]:
    if len(points) <= limit:
        return points
    step = len(points) / limit
    return [points[int(i * step)] for i in range(limit)] + [points[-1]]


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.2f}".rstrip("0").rstrip(".")


def line_chart(
    title: str, series: list[Series], *, width: int = 640, height: int = 200, unit: str = "", step: bool = False
) -> Markup:
    """Several series on one time axis, with a legend and min/max labels.

    `step`: a sampled count (queue depth, fleet size) holds its value until the next
    sample, so it is drawn flat then straight up or down; a slope between two samples
    would show values that never existed (2.5 machines)."""
    left, right, top, bottom = 48, 10, 24, 36
    plot_w, plot_h = width - left - right, height - top - bottom
    all_points = [p for s in series for p in s.points]
    parts = [
        f'<svg class="chart" role="img" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">',
        f'<text x="{left}" y="16" class="chart-title">{escape(title)}</text>',
    ]
    if not all_points:
        parts.append(f'<text x="{left}" y="{top + plot_h // 2}" class="chart-empty">no data recorded yet</text>')
        parts.append("</svg>")
        return Markup("".join(parts))
    t0 = min(p[0] for p in all_points).timestamp()
    t1 = max(p[0] for p in all_points).timestamp()
    vmax = max(max(p[1] for p in all_points), 0.0)
    vmin = min(min(p[1] for p in all_points), 0.0)
    span_t = (t1 - t0) or 1.0
    span_v = (vmax - vmin) or 1.0

    def xy(at: datetime, value: float) -> str:
        x = left + (at.timestamp() - t0) / span_t * plot_w
        y = top + plot_h - (value - vmin) / span_v * plot_h
        return f"{x:.1f},{y:.1f}"

    parts.append(
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" class="axis"/>'
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" class="axis"/>'
        f'<text x="{left - 4}" y="{top + 4}" class="tick" text-anchor="end">{_fmt(vmax)}{escape(unit)}</text>'
        f'<text x="{left - 4}" y="{top + plot_h}" class="tick" text-anchor="end">{_fmt(vmin)}</text>'
        f'<text x="{left}" y="{height - 20}" class="tick">{datetime.fromtimestamp(t0, UTC):%H:%M}</text>'
        f'<text x="{left + plot_w}" y="{height - 20}" class="tick" text-anchor="end">'
        f"{datetime.fromtimestamp(t1, UTC):%H:%M}</text>"
    )
    legend_x = left
    for i, s in enumerate(series):
        colour = PALETTE[i % len(PALETTE)]
        points = _downsample(sorted(s.points))
        if len(points) == 1:
            x, y = xy(*points[0]).split(",")
            parts.append(f'<circle cx="{x}" cy="{y}" r="2.5" fill="{colour}"/>')
        else:
            if step:
                corners = [points[0]]
                for (_, before), (at, v) in itertools.pairwise(points):
                    corners += [(at, before), (at, v)]
                path = " ".join(xy(at, v) for at, v in corners)
            else:
                path = " ".join(xy(at, v) for at, v in points)
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.6" points="{path}"/>')
        parts.append(
            f'<rect x="{legend_x}" y="{height - 12}" width="10" height="4" fill="{colour}"/>'
            f'<text x="{legend_x + 14}" y="{height - 7}" class="legend">{escape(s.name)}</text>'
        )
        legend_x += 24 + 7 * len(s.name)
    parts.append("</svg>")
    return Markup("".join(parts))


def sparkline(values: list[float], *, width: int = 90, height: int = 20, vmax: float = 100.0) -> Markup:
    """A tiny line of recent values (GPU utilisation %), scaled to 0..vmax."""
    if not values:
        return Markup('<span class="muted">no samples</span>')
    values = values[-60:]
    step = width / max(len(values) - 1, 1)
    pts = " ".join(
        f"{i * step:.1f},{height - min(max(v, 0.0), vmax) / vmax * (height - 2) - 1:.1f}" for i, v in enumerate(values)
    )
    return Markup(
        f'<svg class="spark" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'role="img" aria-label="GPU utilisation, last {len(values)} samples" xmlns="http://www.w3.org/2000/svg">'
        f'<polyline fill="none" stroke="#1f77b4" stroke-width="1.4" points="{pts}"/></svg>'
    )
