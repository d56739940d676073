"""The agent's loop on a spot notice and on a server drain, in process: the grace comes
from the notice's deadline, the heartbeat carries the notice, and a drain's deadline
can be brought forward (never pushed back)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from autoscaler.agent.decisions import StopRequest
from autoscaler.agent.gpus import GpuSource
from autoscaler.agent.loop import Agent, Mode
from autoscaler.agent.metadata import Notice
from autoscaler.agent.runner import TaskProcess
from autoscaler.agent.server_api import ServerApi
from autoscaler.agent.settings import AgentSettings, Timing
from autoscaler.agent.wire import Commands, GpuInfo, GpuMetric, HeartbeatBody

WALL = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


class _Gpus:
    description = "none"

    def inventory(self) -> list[GpuInfo]:
        return []

    def sample(self) -> list[GpuMetric]:
        return []


class _Api:
    def __init__(self) -> None:
        self.heartbeats: list[HeartbeatBody] = []

    def heartbeat(self, body: HeartbeatBody) -> Commands:
        self.heartbeats.append(body)
        return Commands()

    def deliver(self, *_: Any) -> None:
        pass


class _Task:
    """Stands in for a running TaskProcess: records how it was asked to stop."""

    task_id = "t1"

    def __init__(self) -> None:
        self.stops: list[tuple[str, float]] = []
        self.stop: StopRequest | None = None

    def request_stop(self, stop: StopRequest, now: float, grace_s: float) -> None:
        self.stop = self.stop or stop
        self.stops.append((stop.cause, grace_s))


def _agent(provider: str, **timing: Any) -> tuple[Agent, _Api, _Task]:
    settings = AgentSettings(
        server_url="http://server",
        pool="p",
        provider=provider,
        join_token="j",
        join_token_ref=None,
        instance_id="i-1",
        timing=Timing(**timing),
    )
    api = _Api()
    agent = Agent(
        settings,
        cast(ServerApi, api),
        cast(GpuSource, _Gpus()),
        None,
        clock=lambda: 0.0,
        sleep=lambda _: None,
        wall=lambda: WALL,
    )
    task = _Task()
    agent.tasks["t1"] = cast(TaskProcess, task)
    return agent, api, task


@pytest.mark.parametrize(
    ("provider", "lead_s", "margin", "grace"),
    [
        ("aws", 120, None, 110.0),  # AWS's two minutes, less the aws margin (10 s)
        ("gcp", 30, None, 25.0),
        ("azure", 45, None, 40.0),
        ("aws", 120, 30.0, 90.0),  # --preempt-margin overrides the cloud's default
    ],
)
def test_the_grace_is_the_notice_deadline_less_the_margin(
    provider: str, lead_s: float, margin: float | None, grace: float
) -> None:
    agent, api, task = _agent(provider, preempt_margin_s=margin)
    notice = Notice(f"{provider} notice", WALL + timedelta(seconds=lead_s))
    agent._begin_preemption(5.0, notice)
    assert agent.mode == Mode.PREEMPTED
    assert task.stops == [("spot", grace)]
    agent._heartbeat(5.0)
    hb = api.heartbeats[-1]
    assert (hb.preempted, hb.preempt_reason, hb.preempt_deadline) == (True, f"{provider} notice", notice.deadline)


def test_a_notice_without_a_usable_time_gets_the_fallback_grace() -> None:
    agent, _, task = _agent("azure", preempt_grace_s=12.0)
    agent._begin_preemption(0.0, Notice("azure Preempt event E not before ?"))
    agent2, _, task2 = _agent("aws", preempt_grace_s=12.0)
    agent2._begin_preemption(0.0, Notice("aws spot terminate", WALL - timedelta(seconds=30)))  # skewed clock
    assert task.stops == [("spot", 12.0)] and task2.stops == [("spot", 12.0)]


def test_the_server_may_bring_a_drain_deadline_forward_but_not_back() -> None:
    agent, _, task = _agent("aws")
    # A rebalance: drained with a deadline a week away; the task is not touched.
    agent._obey(0.0, Commands(drain=True, drain_deadline=WALL + timedelta(days=7)))
    assert agent.mode == Mode.DRAINING and task.stops == []
    assert agent.drain_deadline == pytest.approx(7 * 86400.0)
    # The interruption follows: two minutes.
    agent._obey(10.0, Commands(drain=True, drain_deadline=WALL + timedelta(seconds=120)))
    assert agent.drain_deadline == pytest.approx(130.0)
    # A later deadline never pushes it back.
    agent._obey(20.0, Commands(drain=True, drain_deadline=WALL + timedelta(days=1)))
    assert agent.drain_deadline == pytest.approx(130.0)
    agent._enforce_drain_deadline(129.0)
    assert task.stops == []
    agent._enforce_drain_deadline(130.0)
    assert task.stops and task.stops[0][0] == "drain"
