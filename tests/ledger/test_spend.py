"""Ledger: segments split at month ends, charged to the launching team; month-to-date,
burn, forecast; the spend API's scoping and errors."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.api.context import AppContext
from autoscaler.errors import InvalidInput
from autoscaler.ledger import accrue, burn_rate, forecast, month_to_date, parse_month, segments, spend_report
from autoscaler.state.db import transaction
from autoscaler.state.models import Instance, SpendRecord
from tests.conftest import LiveServer, issue_token

T = datetime(2026, 3, 31, 22, 0, tzinfo=UTC)


def _instance(
    s: Session,
    *,
    team: str | None,
    price: float,
    launched: datetime,
    state: str = "ready",
    terminated: datetime | None = None,
) -> Instance:
    inst = Instance(
        request_id=f"r-{team}-{launched.timestamp()}",
        provider="fake",
        pool="gpu-pool",
        instance_type="g.1",
        capacity_type="spot",
        gpus=1,
        state=state,
        team=team,
        hourly_price=price,
        created_at=launched,
        updated_at=launched,
        launched_at=launched,
        terminated_at=terminated,
    )
    s.add(inst)
    s.flush()
    return inst


def test_segments_split_at_month_end_and_accrue_idempotently(sessions: sessionmaker[Session]) -> None:
    with transaction(sessions) as s:
        _instance(s, team="vision", price=2.0, launched=T)
        _instance(s, team=None, price=1.0, launched=T, state="terminated", terminated=T + timedelta(hours=1))
    later = T + timedelta(hours=4)  # 2 h in March, 2 h in April
    with transaction(sessions) as s:
        accrue(s, now=later)
        accrue(s, now=later)  # a second accrual at the same instant changes nothing
    with sessions() as s:
        march = month_to_date(s, T)
        april = month_to_date(s, later)
        rows = segments(s, "2026-04")
    assert march == {"vision": pytest.approx(4.0), "shared": pytest.approx(1.0)}
    assert april == {"vision": pytest.approx(4.0)}
    assert [(r.team, r.start) for r in rows] == [("vision", datetime(2026, 4, 1, tzinfo=UTC))]


def test_burn_forecast_and_report(sessions: sessionmaker[Session]) -> None:
    now = datetime(2026, 3, 10, tzinfo=UTC)
    with transaction(sessions) as s:
        _instance(s, team="nlp", price=3.0, launched=now - timedelta(hours=10))
        accrue(s, now=now)
    with sessions() as s:
        assert burn_rate(s) == {"nlp": 3.0}
        (row,) = spend_report(s, now=now)
    hours_left = (datetime(2026, 4, 1, tzinfo=UTC) - now).total_seconds() / 3600
    assert row.month_to_date_usd == pytest.approx(30.0)
    assert row.forecast_usd == pytest.approx(30.0 + 3.0 * hours_left)
    assert forecast(10.0, 2.0, now, now + timedelta(hours=5)) == 20.0


@pytest.mark.parametrize("bad", ["2026-13", "26-03", "march", "2026-3", ""])
def test_bad_month_is_one_clear_error(bad: str) -> None:
    with pytest.raises(InvalidInput, match="YYYY-MM"):
        parse_month(bad)


def test_spend_api_scopes_teams_and_refuses_bad_input(ctx: AppContext) -> None:
    now = ctx.clock.now()
    with transaction(ctx.sessions) as s:
        _instance(s, team="vision", price=1.0, launched=now - timedelta(hours=2))
        _instance(s, team="nlp", price=1.0, launched=now - timedelta(hours=1))
        accrue(s, now=now)
    admin = issue_token(ctx, "admin")
    vision = issue_token(ctx, "team", team="vision")
    server = LiveServer(ctx).start()
    try:

        def get(token: str, **params: str) -> httpx.Response:
            return httpx.get(f"{server.url}/api/v1/spend", params=params, headers={"Authorization": f"Bearer {token}"})

        all_teams = get(admin).json()
        assert {t["team"] for t in all_teams["teams"]} == {"vision", "nlp"}
        assert all_teams["total_usd"] == pytest.approx(3.0, abs=0.01)
        own = get(vision).json()
        assert [t["team"] for t in own["teams"]] == ["vision"]
        assert get(vision, team="nlp").status_code == 403
        bad = get(admin, month="2026-13")
        assert bad.status_code == 422 and "YYYY-MM" in bad.json()["detail"]
        assert get(admin, month="1999-01").json()["teams"] == []
    finally:
        server.stop()
    with ctx.sessions() as s:
        assert s.scalars(select(SpendRecord)).all()
