"""The dashboard's first-hour rough edges (issue 23 item 9): repeated decisions
collapse into one entry, plans read in words, sampled counts are drawn as steps, the
login page says where the admin token is, and the simulator's spend chart gives every
team its own colour with bars per month."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from autoscaler.state.db import transaction
from autoscaler.state.models import DecisionRecord
from autoscaler.web.charts import Series, line_chart
from autoscaler.web.views import _plan_words
from tests.conftest import LiveServer

WARNING = "vision has no budget: every decision warns until it has one"


def _cycles(live_server: LiveServer, n: int) -> datetime:
    """n identical cycles, 15 s apart, then one that says something new."""
    ctx = live_server.ctx
    start = ctx.clock.now() - timedelta(hours=1)
    same = {"holds": [{"team": "vision", "tasks": 2}], "holds_count": 1, "launches_count": 0}
    with transaction(ctx.sessions) as s:
        for i in range(n):
            s.add(
                DecisionRecord(
                    at=start + timedelta(seconds=15 * i), policy_revision="r1", reasons=[WARNING, WARNING], plan=same
                )
            )
        s.add(
            DecisionRecord(
                at=start + timedelta(seconds=15 * n),
                policy_revision="r1",
                reasons=["queue gpu: launching g.1"],
                plan={"launches": [{"pool": "gpu-pool"}] * 3, "launches_count": 7},
            )
        )
    return start


def test_repeated_cycles_collapse_and_plans_read_in_words(
    live_server: LiveServer, admin_token: str, browser: Any, artifacts: Path
) -> None:
    start = _cycles(live_server, 200)
    page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    try:
        page.goto(f"{live_server.url}/login?next=/decisions")
        page.fill("#token", admin_token)
        page.click("button[type=submit]")
        page.wait_for_url(f"{live_server.url}/decisions")
        entries = page.locator("#decisions > li")
        assert entries.count() == 2  # the new cycle, and the identical ones before it as one
        steady = entries.nth(1)
        # The page reads the last 50 cycles: the newest one and 49 of the 200 repeats.
        assert steady.locator(".repeats").get_attribute("data-repeats") == "48"
        oldest_shown = start + timedelta(seconds=15 * (200 - 49))
        assert f"since {oldest_shown:%Y-%m-%d %H:%M:%S}Z" in steady.inner_text()
        text = page.locator("#decisions").inner_text()
        assert text.count(WARNING) == 1  # nor twice within one cycle
        assert "Plan: launch 7 machines." in text  # the full count, not the 3 items kept
        assert "Plan: keep 1 group of tasks waiting." in text
        assert "_count" not in text and "holds" not in text
        height = page.evaluate("document.documentElement.scrollHeight")
        assert height < 1500, height  # was 8,560 px for a few hundred cycles
        page.screenshot(path=str(artifacts / "decisions-collapsed.png"), full_page=True)
    finally:
        page.context.close()


def test_a_change_breaks_the_run_of_repeats(live_server: LiveServer, admin_token: str) -> None:
    import httpx

    ctx = live_server.ctx
    t = ctx.clock.now() - timedelta(minutes=5)
    with transaction(ctx.sessions) as s:
        for i, reason in enumerate(["a", "a", "b", "a"]):
            s.add(DecisionRecord(at=t + timedelta(seconds=i), reasons=[reason], plan={}))
    http = httpx.Client(base_url=live_server.url, timeout=10)
    http.post("/login", data={"token": admin_token, "next": "/decisions"})
    html = http.get("/decisions").text
    assert html.count('data-decision="') == 3 and 'data-repeats="1"' in html  # a | b | a a


def test_plan_words() -> None:
    assert _plan_words({"launches": [{}], "drains": [], "terminations_count": 2}) == [
        "launch 1 machine",
        "terminate 2 machines",
    ]
    assert _plan_words({"placed_on_existing": 3, "notes": ["x"], "odd_key": [1, 2]}) == [
        "place 3 tasks on running machines",
        "odd key: 2",
    ]


def test_sampled_counts_are_drawn_as_steps() -> None:
    t0 = datetime(2026, 3, 1)
    pts = [(t0 + timedelta(minutes=i), float(v)) for i, v in enumerate([0, 2, 2, 1])]

    def corners(svg: str) -> list[tuple[float, float]]:
        raw = svg.split('points="', 1)[1].split('"', 1)[0].split()
        return [(float(x), float(y)) for x, y in (p.split(",") for p in raw)]

    stepped = corners(str(line_chart("fleet", [Series("p", pts)], step=True)))
    assert len(stepped) == 2 * len(pts) - 1
    for (x0, y0), (x1, y1) in itertools.pairwise(stepped):
        assert x0 == x1 or y0 == y1  # flat or vertical, never a slope
    sloped = corners(str(line_chart("spend", [Series("p", pts)])))
    assert len(sloped) == len(pts)


def test_spend_chart_gives_15_teams_15_colours_and_no_line_across_months() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from autoscaler.sim.report import spend_figure

    teams = {
        f"team-{i:02d}": {
            "spend_by_month_usd": {"2026-01": 100.0 + i, "2026-02": 50.0 + i},
            "budget": {"monthly_usd": 120.0, "kind": "hard"} if i % 2 else None,
        }
        for i in range(15)
    }
    fig = spend_figure({"teams": teams})
    try:
        (ax,) = fig.axes
        colours = {tuple(p.get_facecolor()) for p in ax.patches}
        assert len(ax.patches) == 30 and len(colours) == 15
        assert ax.get_lines() == []  # months are bars; budgets are marks over them, not lines joining months
        assert [t.get_text() for t in ax.get_xticklabels()] == ["2026-01", "2026-02"]
    finally:
        plt.close(fig)
