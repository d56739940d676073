"""Structured JSON logs carry the message and the task/worker/instance/decision ids."""

from __future__ import annotations

import json
import logging

import pytest

from autoscaler.logging_setup import JsonFormatter, configure_logging, log_context


def _line(record_logger: logging.Logger, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return dict(json.loads(err[0]))


def test_json_lines_carry_ids_from_extra_and_context(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTOSCALER_LOG_FORMAT", "json")
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        configure_logging()
        log = logging.getLogger("autoscaler.test")
        with log_context(decision_id=42, instance_id="i-1"):
            log.info("launched %s", "g.1", extra={"task_id": "t-9", "worker_id": "w-3"})
        doc = _line(log, capsys)
        assert doc["message"] == "launched g.1" and doc["level"] == "info" and doc["logger"] == "autoscaler.test"
        assert (doc["decision_id"], doc["instance_id"], doc["task_id"], doc["worker_id"]) == (
            42,
            "i-1",
            "t-9",
            "w-3",
        )
        log.warning("outside")
        assert "decision_id" not in _line(log, capsys), "the context ends with the block"
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


def test_exceptions_are_one_json_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord(
            "x", logging.ERROR, __file__, 1, "failed", None, exc_info=__import__("sys").exc_info()
        )
    doc = json.loads(JsonFormatter().format(record))
    assert "ValueError: boom" in doc["exception"] and "\n" not in JsonFormatter().format(record)
