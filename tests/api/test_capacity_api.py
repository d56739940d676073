"""Tasks declare what they survive and how long they run; the server estimates the
run time from history, `task why` says spot or on-demand with the numbers, and
`/metrics` shows the observed reclaim rates. Through the real ASGI app, both databases."""

from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from autoscaler.api.app import create_app
from autoscaler.api.context import AppContext
from autoscaler.clock import ManualClock
from autoscaler.state.db import transaction
from autoscaler.state.models import Task, TaskAttempt, new_id
from tests.conftest import issue_token, make_context
from tests.spot_lives import add_spot_life


def _world(config, sessions, clock: ManualClock):
    ctx = make_context(config, sessions, clock)
    client = TestClient(create_app(ctx))
    vision = {"Authorization": f"Bearer {issue_token(ctx, 'team', team='vision')}"}
    return ctx, client, vision


@pytest.fixture
def world(config, sessions, clock: ManualClock):
    return _world(config, sessions, clock)


@pytest.fixture
def wait_world(config, sessions, clock: ManualClock):
    """The same with a 30 min wait target (off by default) and no standby machines: each
    reclaim waits a boot."""
    capacity = config.capacity.model_copy(update={"wait_target_s": 1800.0, "standby": False})
    return _world(config.model_copy(update={"capacity": capacity}), sessions, clock)


@pytest.fixture
def standby_world(config, sessions, clock: ManualClock):
    """A 30 min wait target with standby machines (the default once a target is set)."""
    capacity = config.capacity.model_copy(update={"wait_target_s": 1800.0})
    return _world(config.model_copy(update={"capacity": capacity}), sessions, clock)


def _enqueue(client: TestClient, headers: dict[str, str], **body: object) -> dict:
    r = client.post("/api/v1/tasks", json={"queue": "gpu", "command": ["train"], "gpus": 1, **body}, headers=headers)
    assert r.status_code == 201, r.text
    return r.json()


def test_a_declared_run_time_and_checkpoints_are_kept_and_shown(world) -> None:
    _, client, vision = world
    task = _enqueue(client, vision, checkpoints="every:30", expected_runtime_s=7200)
    assert task["checkpoints"] == "every:30" and task["expected_runtime_s"] == 7200
    assert task["runtime_estimate"]["source"] == "declared" and task["runtime_estimate"]["mean_h"] == 2.0
    again = client.get(f"/api/v1/tasks/{task['id']}", headers=vision).json()
    assert again["runtime_estimate"] == task["runtime_estimate"]


def test_a_checkpoint_dir_means_on_signal_and_none_is_stored_as_none(world) -> None:
    _, client, vision = world
    assert _enqueue(client, vision, checkpoint_dir="ckpt")["checkpoints"] == "on-signal"
    assert _enqueue(client, vision, checkpoint_dir="ckpt", checkpoints="none")["checkpoints"] is None
    assert _enqueue(client, vision)["checkpoints"] is None


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"checkpoints": "sometimes"}, "none, on-signal or every:MIN"),
        ({"checkpoints": "every:0"}, "none, on-signal or every:MIN"),
        ({"expected_runtime_s": -5}, "expected_runtime_s"),
    ],
)
def test_a_bad_declaration_is_refused_saying_what_is_accepted(world, body: dict, words: str) -> None:
    _, client, vision = world
    r = client.post("/api/v1/tasks", json={"queue": "gpu", "command": ["x"], **body}, headers=vision)
    assert r.status_code == 422 and words in r.text


def _past_run(ctx, hours: float, *, command: list[str], team: str = "vision") -> None:
    """A finished run of `command`: one attempt of `hours`, succeeded."""
    now = ctx.clock.now()
    from autoscaler.queueing.runtime_history import command_key

    with transaction(ctx.sessions) as s:
        t = Task(
            id=new_id(),
            queue="gpu",
            team=team,
            command=command,
            command_key=command_key(command),
            state="succeeded",
            attempts=1,
            sort_key=now,
            created_at=now,
            updated_at=now,
            finished_at=now,
        )
        s.add(t)
        s.flush()
        s.add(TaskAttempt(task_id=t.id, attempt=1, team=team, started_at=now - timedelta(hours=hours), ended_at=now))


def test_without_a_declaration_the_run_time_comes_from_earlier_runs_of_the_same_command(world) -> None:
    ctx, client, vision = world
    prior = _enqueue(client, vision, command=["python", "train.py"])["runtime_estimate"]
    assert prior["source"] == "prior" and prior["runs"] == 0
    for h in (6.0, 6.5, 5.5, 6.0):
        _past_run(ctx, h, command=["python", "train.py"])
    _past_run(ctx, 0.1, command=["python", "other.py"])  # another command: not its history
    _past_run(ctx, 0.1, command=["python", "train.py"], team="nlp")  # another team: neither
    est = _enqueue(client, vision, command=["python", "train.py"])["runtime_estimate"]
    assert est["source"] == "history" and est["runs"] == 4
    assert 3.0 < est["mean_h"] < 8.0 and est["p10_h"] < est["mean_h"] < est["p90_h"]


def test_without_a_wait_target_a_long_checkpointing_task_goes_where_it_costs_least(world) -> None:
    _, client, vision = world
    saved = _enqueue(client, vision, expected_runtime_s=30 * 3600, checkpoints="on-signal")
    why = client.get(f"/api/v1/tasks/{saved['id']}/why", headers=vision).json()["capacity"]
    assert why["capacity_type"] == "spot" and why["wait_target_s"] is None
    assert why["spot_expected_cost_usd"] < why["on_demand_expected_cost_usd"]


def test_task_why_says_spot_or_on_demand_with_the_numbers(wait_world) -> None:
    _, client, vision = wait_world
    short = _enqueue(client, vision, expected_runtime_s=3600)
    long = _enqueue(client, vision, expected_runtime_s=30 * 3600)
    saved = _enqueue(client, vision, expected_runtime_s=30 * 3600, checkpoints="on-signal")
    why = {t["id"]: client.get(f"/api/v1/tasks/{t['id']}/why", headers=vision).json() for t in (short, long, saved)}
    assert why[short["id"]]["capacity"]["capacity_type"] == "spot"
    # 30 h from zero at 0.24/h on 0.4 USD/h spot: 0.4 x (0.05 + (e^7.2 - 1)/0.24) against 1.0 x 30.05.
    long_why = why[long["id"]]["capacity"]
    assert long_why["capacity_type"] == "on_demand"
    assert long_why["on_demand_expected_cost_usd"] == pytest.approx(30.05)
    assert long_why["spot_expected_cost_usd"] == pytest.approx(0.4 * (0.05 + 5576.78), rel=1e-4)
    assert "on-demand" in long_why["reason"]
    # 30 h on-signal is cheaper on spot, but 7.3 reclaims expected at 0.24/h, each a 3 min
    # boot, pass a 30 min wait target with a 20 % chance: on-demand, saying so.
    saved_why = why[saved["id"]]["capacity"]
    assert saved_why["capacity_type"] == "on_demand" and saved_why["wait_target_s"] == 1800
    assert saved_why["spot_expected_cost_usd"] < saved_why["on_demand_expected_cost_usd"]
    assert saved_why["spot_wait_miss_chance"] == pytest.approx(0.1998, abs=1e-3)
    assert "would pass the wait target of 30 min" in saved_why["reason"]


def test_task_why_counts_the_reclaims_a_task_already_waited_through(wait_world) -> None:
    ctx, client, vision = wait_world
    # 10 h on-signal: 2.4 reclaims expected, P(more than 9) = 0.02 %: spot.
    task = _enqueue(client, vision, expected_runtime_s=10 * 3600, checkpoints="on-signal")
    fresh = client.get(f"/api/v1/tasks/{task['id']}/why", headers=vision).json()["capacity"]
    assert fresh["capacity_type"] == "spot" and fresh["reclaims_so_far"] == 0
    # After 8 interruptions it has waited 9 boots of its 30 min: one more is allowed,
    # P(more than 1) = 70 %: on-demand.
    with transaction(ctx.sessions) as s:
        row = s.get(Task, task["id"])
        assert row is not None
        row.interruptions = 8
    again = client.get(f"/api/v1/tasks/{task['id']}/why", headers=vision).json()["capacity"]
    assert again["capacity_type"] == "on_demand" and again["reclaims_so_far"] == 8
    assert again["spot_wait_miss_chance"] == pytest.approx(0.698, abs=1e-3)
    assert "1 more allowed after 8 so far" in again["reason"]


def test_with_standby_machines_task_why_keeps_a_long_checkpointing_task_on_spot(standby_world) -> None:
    ctx, client, vision = standby_world
    # The 30 h on-signal task that would pass the target on spot above: with standby
    # machines a reclaim waits a boot only with chance 1 %, so 0.07 boot waits are
    # expected and spot keeps the target.
    task = _enqueue(client, vision, expected_runtime_s=30 * 3600, checkpoints="on-signal")
    why = client.get(f"/api/v1/tasks/{task['id']}/why", headers=vision).json()["capacity"]
    assert why["capacity_type"] == "spot" and why["standby_miss_chance"] == 0.01
    assert why["spot_wait_miss_chance"] < 1e-6
    assert "keeps the wait target of 30 min: with standby machines a reclaim waits (chance 1%)" in why["reason"]
    # 150 reclaims lived through cost it about two boots of wait (1.5), not 150.
    with transaction(ctx.sessions) as s:
        row = s.get(Task, task["id"])
        assert row is not None
        row.interruptions = 150
    again = client.get(f"/api/v1/tasks/{task['id']}/why", headers=vision).json()["capacity"]
    assert again["reclaims_so_far"] == 150 and again["boots_waited_so_far"] == 2
    assert again["capacity_type"] == "spot" and "7 more allowed after 2 so far" in again["reason"]


def test_metrics_show_the_observed_reclaim_rate_per_offering(world) -> None:
    ctx, client, vision = world
    _reclaimed_spot_lives(ctx, zone="z1", count=1, hours=2)
    text = client.get("/metrics", headers=vision).text
    line = next(x for x in text.splitlines() if x.startswith("autoscaler_spot_reclaim_rate{"))
    assert 'offering="spot/g.1/z1"' in line
    # (0.24 x 20 + 1) / (20 + 2)
    assert float(line.rsplit(" ", 1)[1]) == pytest.approx(5.8 / 22, rel=1e-3)
    assert 'autoscaler_spot_reclaims{instance_type="g.1",offering="spot/g.1/z1",zone="z1"} 1.0' in text


def test_task_why_tries_a_zone_that_has_only_the_prior(config, sessions, clock: ManualClock) -> None:
    # Zone z1 has lived 100 spot hours with 16 reclaims: (0.24 x 20 + 16) / 120 = 0.173/h,
    # sd sqrt(20.8) / 120 = 0.038, optimistic 0.135. Zone z2 has only the prior: 0.24/h,
    # optimistic 0.1305. A 30 h task that checkpoints costs 0.4 % more on z2's estimate,
    # so it tries z2; one restarting from zero, 2 h, stays on z1 (z2 is 7.2 % dearer).
    pools = [p.model_copy(update={"zones": ["z1", "z2"]}) if p.name == "gpu-pool" else p for p in config.pools]
    ctx, client, vision = _world(config.model_copy(update={"pools": pools}), sessions, clock)
    _reclaimed_spot_lives(ctx, zone="z1", count=16, hours=6.25)
    saved = _enqueue(client, vision, expected_runtime_s=30 * 3600, checkpoints="on-signal")
    why = client.get(f"/api/v1/tasks/{saved['id']}/why", headers=vision).json()["capacity"]
    assert why["capacity_type"] == "spot" and why["offering"] == "spot/g.1/z2"
    assert "trying spot/g.1/z2" in why["reason"] and "within 5% of spot/g.1/z1" in why["reason"]
    short = _enqueue(client, vision, expected_runtime_s=2 * 3600)
    why = client.get(f"/api/v1/tasks/{short['id']}/why", headers=vision).json()["capacity"]
    assert why["capacity_type"] == "spot" and why["offering"] == "spot/g.1/z1" and "trying" not in why["reason"]


def _reclaimed_spot_lives(ctx: AppContext, *, zone: str, count: int, hours: float) -> None:
    """`count` g.1 spot machines in `zone`, each reclaimed now after `hours` of life."""
    with transaction(ctx.sessions) as s:
        for _ in range(count):
            add_spot_life(s, ctx.clock, hours=hours, ended_h_ago=0, reclaimed=True, zone=zone)
