from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.clock import ManualClock
from autoscaler.config import AutoscalerConfig
from autoscaler.policy.service import PolicyService
from autoscaler.state.db import make_engine, session_factory
from tests.reconciler.harness import Rig, make_rig, policy_service


@pytest.fixture(scope="session")
def shipped_policy() -> Iterator[PolicyService]:
    svc = policy_service()
    yield svc
    svc.close()


@pytest.fixture
def sqlite_sessions(sqlite_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(sqlite_url)
    yield session_factory(engine)
    engine.dispose()


@pytest.fixture
def rig(
    sqlite_sessions: sessionmaker[Session],
    config: AutoscalerConfig,
    clock: ManualClock,
    shipped_policy: PolicyService,
) -> Rig:
    return make_rig(sqlite_sessions, config, clock, shipped_policy)


@pytest.fixture
def any_rig(db_url: str, config: AutoscalerConfig, clock: ManualClock, shipped_policy: PolicyService) -> Iterator[Rig]:
    """A rig on each backend: `db_url` runs the test on SQLite and on PostgreSQL."""
    engine = make_engine(db_url)
    yield make_rig(session_factory(engine), config, clock, shipped_policy)
    engine.dispose()
