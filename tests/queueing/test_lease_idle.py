"""An idle agent's lease poll with nothing queued costs one cheap query and locks nothing."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event

from tests.queueing.helpers import add_task, add_worker, lease


@pytest.fixture
def setup(ctx, clock):
    from tests.conftest import make_context

    return make_context(ctx.config, ctx.sessions, clock)


def _statements(sessions: Any) -> list[str]:
    seen: list[str] = []
    engine = sessions.kw["bind"]

    @event.listens_for(engine, "before_cursor_execute")
    def _record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    return seen


def test_empty_lease_is_one_query_without_locks(setup, clock) -> None:
    s = setup.sessions
    w = add_worker(s, clock)
    seen = _statements(s)
    assert lease(s, clock, w) is None
    queries = [q for q in seen if q.lstrip().upper().startswith("SELECT")]
    assert len(queries) == 1, queries
    assert "FOR UPDATE" not in queries[0].upper()


def test_lease_after_the_probe_still_finds_new_work(setup, clock) -> None:
    s = setup.sessions
    w = add_worker(s, clock)
    assert lease(s, clock, w) is None
    t = add_task(s, clock)
    leased = lease(s, clock, w)
    assert leased is not None and leased.id == t
