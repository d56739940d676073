"""`autoscaler explain`: why the last reconcile cycle launched, held or terminated."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from autoscaler.cli import app
from autoscaler.cli.common import HomeOpt, JsonOpt, ServerOpt, TokenOpt, client, out, print_json
from autoscaler.errors import NotFound


def render_explanation(row: dict[str, Any]) -> list[str]:
    """The decision record in plain words (also used by tests)."""
    summary = row.get("summary") or {}
    revision = (row.get("policy_revision") or "?")[:12]
    if "team" in summary:
        head = f"cycle {row['id']} at {row['at']}, team {summary['team']}: policy revision {revision}"
        return [head, *(f"  - {reason}" for reason in row.get("reasons") or [])]
    head = (
        f"cycle {row['id']} at {row['at']}: {summary.get('pending_tasks', 0)} queued task(s), "
        f"{summary.get('workers', 0)} worker(s); policy revision {revision}; "
        f"took {row.get('cycle_ms', 0):.0f} ms"
    )
    lines = [head]
    if row.get("error"):
        lines.append(f"  policy error: {row['error']}")
    lines.extend(f"  - {reason}" for reason in row.get("reasons") or [])
    return lines


@app.command()
def explain(
    cycle: Annotated[int | None, typer.Option("--cycle", help="A cycle id (default: the last one).")] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Why the last reconcile cycle launched, held or terminated (a team token: its team's part only)."""
    api = client(server, token, home)
    if cycle is not None:
        row = api.get(f"/api/v1/decisions/{cycle}")
    else:
        rows = api.get("/api/v1/decisions", limit=1)
        if not rows:
            raise NotFound("no reconcile cycle has been recorded yet: is `autoscaler up` running?")
        row = rows[0]
    if json_out:
        print_json(row)
        return
    for line in render_explanation(row):
        out.print(line)
