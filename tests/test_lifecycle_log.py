"""Lifecycle lines reach the server's log only for changes that committed."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.state.db import transaction
from autoscaler.state.lifecycle_log import note


def test_a_committed_change_is_logged_once_with_its_ids(
    sessions: sessionmaker[Session], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="autoscaler.lifecycle")
    with transaction(sessions) as s:
        note(s, "task %s leased", "t1", task_id="t1", team=None)
        assert not caplog.records  # not before the commit
    (rec,) = caplog.records
    assert rec.getMessage() == "task t1 leased" and rec.__dict__["task_id"] == "t1"
    assert "team" not in rec.__dict__  # absent ids are left out
    with transaction(sessions):
        pass
    assert len(caplog.records) == 1  # a later commit does not repeat it


def test_a_rolled_back_change_is_never_logged(
    sessions: sessionmaker[Session], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="autoscaler.lifecycle")
    with pytest.raises(RuntimeError), transaction(sessions) as s:
        note(s, "instance %s launched", "i1")
        raise RuntimeError("conflict")
    with transaction(sessions):
        pass
    assert not caplog.records


def test_nothing_is_kept_when_info_is_off(sessions: sessionmaker[Session], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="autoscaler.lifecycle")
    with transaction(sessions) as s:
        note(s, "worker %s draining", "w1")
        assert not s.info
    assert not caplog.records
