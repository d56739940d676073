"""Server side of the agent's drain and spot reports (queueing.workers.heartbeat)."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy.orm import Session, sessionmaker

from autoscaler.auth.tokens import create_token
from autoscaler.queueing.workers import Registration, heartbeat, register
from autoscaler.state.db import transaction
from autoscaler.state.models import Worker
from tests.agent.conftest import BOTH_BACKENDS

NOW = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


def _worker(sessions: sessionmaker[Session]) -> str:
    with transaction(sessions) as s:
        _, join = create_token(s, kind="join", now=NOW, pool="gpu-pool")
        worker, _ = register(s, join, Registration("h", "i-1", "aws", "gpu-pool"), now=NOW)
        return worker.id


@BOTH_BACKENDS
def test_preempted_heartbeat_marks_the_worker_draining_for_spot(sessions: sessionmaker[Session]) -> None:
    wid = _worker(sessions)
    with transaction(sessions) as s:
        reply = heartbeat(s, wid, now=NOW, draining=True, preempted=True)
        assert reply.drain is True
    with transaction(sessions) as s:
        reply = heartbeat(s, wid, now=NOW, draining=True, preempted=True)  # repeated: no change
        w = s.get(Worker, wid)
        assert w is not None
        assert (w.state, w.drain_reason, w.drain_deadline is not None) == ("draining", "spot", True)


def test_agent_initiated_drain_is_recorded_and_plain_heartbeats_change_nothing(
    sessions: sessionmaker[Session],
) -> None:
    wid = _worker(sessions)
    with transaction(sessions) as s:
        assert heartbeat(s, wid, now=NOW).drain is False
        assert s.get(Worker, wid).state == "idle"  # type: ignore[union-attr]
    with transaction(sessions) as s:
        assert heartbeat(s, wid, now=NOW, draining=True).drain is True
        w = s.get(Worker, wid)
        assert w is not None and (w.state, w.drain_reason) == ("draining", "agent")
