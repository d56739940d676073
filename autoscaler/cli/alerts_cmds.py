"""`autoscaler alerts`: alerts and their delivery status per channel;
`autoscaler alerts test --channel NAME`: one test message through a channel (admin)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from autoscaler.cli import app
from autoscaler.cli.common import HomeOpt, JsonOpt, ServerOpt, TokenOpt, client, out, print_json, print_table
from autoscaler.errors import AutoscalerError

alerts_app = typer.Typer(
    help="Alerts (budget thresholds, hard-budget freezes and drains, pools in backoff, machines that never "
    "registered, policy fail-safe) and their delivery to each channel.",
    invoke_without_command=True,
)
app.add_typer(alerts_app, name="alerts")


def _status(deliveries: list[dict[str, Any]]) -> str:
    if not deliveries:
        return "(no channel)"
    parts = []
    for d in deliveries:
        s = f"{d['channel']}: {d['status']}"
        if d["status"] != "delivered" and d["attempts"]:
            s += f" after {d['attempts']} attempt(s)"
        parts.append(s)
    return "; ".join(parts)


@alerts_app.callback()
def alerts(
    ctx: typer.Context,
    team: Annotated[str | None, typer.Option("--team", help="One team only.")] = None,
    limit: Annotated[int, typer.Option("--limit", help="The newest N alerts.")] = 50,
    json_out: JsonOpt = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
) -> None:
    """The newest alerts and where each was delivered."""
    if ctx.invoked_subcommand is not None:
        return
    data = client(server, token, home).get("/api/v1/alerts", team=team, limit=limit)
    if json_out:
        print_json(data)
        return
    rows = [
        {
            "at": a["created_at"][:19].replace("T", " "),
            "level": a["level"],
            "team": a["team"] or "-",
            "kind": a["kind"],
            "message": a["message"],
            "delivery": _status(a["deliveries"]),
        }
        for a in data["alerts"]
    ]
    if not data["channels"]:
        out.print("no notification channels configured (notifications.channels in autoscaler.yaml)")
    print_table(rows, ["at", "level", "team", "kind", "message", "delivery"], title="Alerts")
    for a in data["alerts"]:
        for d in a["deliveries"]:
            if d["status"] != "delivered" and d["last_error"]:
                out.print(f"alert {a['id']} on {d['channel']}: {d['last_error']}")


@alerts_app.command("test")
def test(
    channel: Annotated[str, typer.Option("--channel", help="A name from notifications.channels.")],
    server: ServerOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
) -> None:
    """Send a test message through one channel now (admin)."""
    result = client(server, token, home).post("/api/v1/alerts/test", {"channel": channel})
    if not result["delivered"]:
        raise AutoscalerError(f"channel {result['channel']} ({result['type']}): not delivered: {result['error']}")
    out.print(f"test message delivered to channel {result['channel']} ({result['type']})")
