"""What each provider error blocks, the pool backoff, and the explain rendering."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from autoscaler.cli.reconcile_cmds import render_explanation
from autoscaler.reconciler.errors import backoff_delay, block_for
from providers.base import (
    AuthError,
    CapacityError,
    InvalidRequest,
    Offering,
    ProviderError,
    QuotaError,
    RateLimited,
    Scope,
    TransientError,
)

NOW = datetime(2026, 3, 10, tzinfo=UTC)
OFF = Offering("g5.xlarge", "spot", "us-east-1a", 1, "A10G", 4, 16000, 0.5, region="us-east-1")


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (CapacityError("x"), ("offering", "spot/g5.xlarge/us-east-1a")),
        (CapacityError("x", scope=Scope.ZONE), ("zone", "us-east-1a")),
        (QuotaError("x", scope=Scope.REGION), ("region", "us-east-1")),
        (QuotaError("x", scope=Scope.PROVIDER), ("provider", "*")),
        (AuthError("x"), ("provider", "*")),
        (InvalidRequest("x"), ("offering", "spot/g5.xlarge/us-east-1a")),
        (RateLimited("x"), None),
        (TransientError("x"), None),
    ],
)
def test_error_blocks_its_scope_for_the_ttl(error: ProviderError, expected: tuple[str, str] | None) -> None:
    block = block_for(error, OFF, region="us-east-1", now=NOW, ttl_s=180)
    assert (None if block is None else (block.scope, block.key)) == expected
    if block is not None:
        assert (block.until - NOW).total_seconds() == 180


def test_backoff_doubles_and_is_capped() -> None:
    assert [backoff_delay(n) for n in range(5)] == [0, 5, 10, 20, 40]
    assert backoff_delay(30) == 300
    assert backoff_delay(1, retry_after_s=30) == 30


def test_explain_renders_the_record_in_plain_words() -> None:
    row = {
        "id": 7,
        "at": "2026-03-10T12:00:00Z",
        "policy_revision": "abcdef0123456789",
        "cycle_ms": 12.3,
        "summary": {"pending_tasks": 4, "workers": 1},
        "error": None,
        "reasons": ["team vision: 92 % of its 10,000 USD monthly budget; scale-up frozen by budgets.rego"],
    }
    lines = render_explanation(row)
    assert lines[0].startswith("cycle 7 at 2026-03-10T12:00:00Z: 4 queued task(s), 1 worker(s)")
    assert "abcdef012345" in lines[0]
    assert lines[1] == "  - team vision: 92 % of its 10,000 USD monthly budget; scale-up frozen by budgets.rego"
