"""The task pages say what the counters mean: failed attempts of max_attempts, and
interruptions apart (over plain HTTP, a worker driven through the real agent API)."""

from __future__ import annotations

import re

import httpx

from tests.conftest import LiveServer, issue_token
from tests.web.helpers import Agent


def _text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def test_task_page_and_list_show_failed_attempts_and_interruptions(live_server: LiveServer, admin_token: str) -> None:
    url = live_server.url
    vision = issue_token(live_server.ctx, "team", team="vision")
    r = httpx.post(
        f"{url}/api/v1/tasks",
        json={"queue": "gpu", "command": ["train"], "gpus": 1, "max_attempts": 3, "retry_on_exit_codes": [1, 137]},
        headers={"Authorization": f"Bearer {vision}"},
        timeout=10,
    )
    assert r.status_code == 201, r.text
    tid = r.json()["id"]
    agent = Agent(url, admin_token)
    assert agent.lease()["id"] == tid
    agent.start(tid)
    agent.finish(tid, exit_code=1)  # retried: back to the queue
    assert agent.lease()["id"] == tid
    agent.start(tid)
    done = agent.http.post(
        f"/api/v1/workers/{agent.id}/tasks/{tid}/finish", json={"reason": "interrupted", "detail": "spot"}
    )
    assert done.status_code == 200, done.text
    agent.close()

    http = httpx.Client(base_url=url, timeout=10)
    assert http.post("/login", data={"token": vision, "next": "/tasks"}).status_code == 303
    page = _text(http.get(f"/tasks/{tid}").text)
    assert "Failed attempts 1 of 3 (only exit codes 1, 137 are retried)" in page, page
    assert "Interruptions 1 (spot, drain, lost worker: never count against the limit)" in page
    assert "Attempts started 2" in page
    # Attempt 1 ended as a failure that was retried, attempt 2 as an interruption.
    assert "Attempt 1 · failed" in page and "reason exit 1 : failed attempt 1 of 3: requeued" in page
    assert "Attempt 2 · interrupted" in page
    listing = http.get("/tasks")
    assert '<th class="num" title="failed attempts of max_attempts">Failed</th>' in listing.text
    row = re.search(rf'<tr data-task="{tid}".*?</tr>', listing.text, re.S)
    assert row is not None and '<td class="num">1/3</td><td class="num">1</td>' in row.group(0)
