"""The dashboard in a real headless Chromium against the real server: log in, watch
a task start running, open its page, see a team's budget bar turn amber past 80 %,
and check that a team member's pages show nothing of another team.

One browser for the session; a screenshot of each page is saved to the artifacts
directory (env AUTOSCALER_ARTIFACTS).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from tests.conftest import LiveServer, issue_token
from tests.web.helpers import Agent, add_instance, add_spend, enqueue

RED_AMBER_GREEN = {"ok": "rgb(46, 125, 50)", "warn": "rgb(249, 168, 37)", "over": "rgb(198, 40, 40)"}


def _login(page: Any, url: str, token: str) -> None:
    page.goto(f"{url}/tasks")
    assert "/login" in page.url, "an anonymous visitor must be sent to the login page"
    page.fill("#token", token)
    page.click("button[type=submit]")
    page.wait_for_url(f"{url}/tasks")


def _bar_fill(page: Any, team: str) -> tuple[str, str]:
    bar = page.locator(f'tr[data-team="{team}"] svg.budget-bar')
    colour = bar.locator("rect.fill").evaluate("el => getComputedStyle(el).fill")
    return str(bar.get_attribute("class")), str(colour)


def test_live_task_and_budget_bar_in_chromium(
    live_server: LiveServer, admin_token: str, browser: Any, artifacts: Path, db_url: str
) -> None:
    ctx, url = live_server.ctx, live_server.url
    backend = db_url.split(":", 1)[0].split("+", 1)[0]
    vision = issue_token(ctx, "team", team="vision")
    mine = enqueue(url, vision, ["python", "train.py", "--epochs", "3"])
    theirs = enqueue(url, issue_token(ctx, "team", team="nlp"), ["nlp-secret-job"])
    now = ctx.clock.now()
    month_start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    add_spend(ctx, team="vision", start=month_start, hours=1, price=50.0)  # 50 % of 100
    add_spend(ctx, team="nlp", start=month_start, hours=1, price=7.0, instance_id="nlp-secret-instance")
    add_instance(ctx, team="nlp", now=now, provider_instance_id="nlp-secret-vm")

    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    try:
        _login(page, url, vision)
        row = page.locator(f'tr[data-task="{mine["id"]}"]')
        assert row.get_attribute("data-state") == "queued"
        assert page.locator("#viewer").inner_text() == "team vision"

        # A real worker leases and starts the task; the list shows it running.
        agent = Agent(url, admin_token)
        assert agent.lease()["id"] == mine["id"]
        agent.start(mine["id"])
        agent.log(mine["id"], "epoch 1/3 loss=0.42\n")
        page.reload()
        assert row.get_attribute("data-state") == "running"
        page.screenshot(path=str(artifacts / f"tasks-{backend}.png"), full_page=True)

        row.locator("a").click()
        page.wait_for_url(f"{url}/tasks/{mine['id']}")
        assert page.locator("#task-state").inner_text() == "running"
        assert page.locator("#task-worker").inner_text() == agent.id
        assert "epoch 1/3 loss=0.42" in page.locator("pre.logs").inner_text()
        page.screenshot(path=str(artifacts / f"task-{backend}.png"), full_page=True)
        agent.close()

        page.goto(url + "/")
        assert _bar_fill(page, "vision") == ("budget-bar ok", RED_AMBER_GREEN["ok"])
        add_spend(ctx, team="vision", start=month_start + timedelta(hours=1), hours=1, price=35.0)  # 85 %
        page.reload()
        assert _bar_fill(page, "vision") == ("budget-bar warn", RED_AMBER_GREEN["warn"])
        assert page.locator('tr[data-queue="gpu"] td.running').inner_text() == "1"
        page.screenshot(path=str(artifacts / f"overview-{backend}.png"), full_page=True)

        # Team isolation: nothing of nlp on any page, and its task is a 404.
        for path in ("/", "/tasks", "/fleet", "/decisions", "/charts", "/tasks?state=queued"):
            page.goto(url + path)
            html = page.content()
            assert "nlp" not in html and theirs["id"] not in html, f"{path} leaks another team's data"
        assert page.goto(f"{url}/tasks/{theirs['id']}").status == 404
        page.screenshot(path=str(artifacts / f"fleet-{backend}.png"), full_page=True)

        page.click("header .logout button")
        page.wait_for_url(f"{url}/login")
        page.goto(url + "/")
        assert "/login" in page.url, "after logging out the cookie no longer opens pages"
    finally:
        context.close()

    # An admin sees every team.
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    try:
        _login(page, url, admin_token)
        assert page.locator(f'tr[data-task="{theirs["id"]}"]').count() == 1
        page.goto(url + "/")
        assert page.locator('tr[data-team="nlp"]').count() == 1
        page.screenshot(path=str(artifacts / f"overview-admin-{backend}.png"), full_page=True)
    finally:
        context.close()
