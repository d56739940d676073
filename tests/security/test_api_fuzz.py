"""Schemathesis against the OpenAPI spec of the real app, in process, on a real
database: every operation, with an admin, a team, a worker, a bad and no token.

Checks: no 5xx, responses (including errors) conform to the documented schema and
content type. Ids in paths are sometimes the real ones (so the handlers behind the
auth checks run too), otherwise what hypothesis generates.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
)
from starlette.testclient import TestClient

from autoscaler.api.app import create_app
from tests.conftest import issue_token

# CI size: a few examples per operation and role; `make reliability` runs more.
CI_EXAMPLES = 6
CHECKS = [not_a_server_error, response_schema_conformance, content_type_conformance]


@pytest.fixture
def fuzz_world(ctx: Any) -> dict[str, Any]:
    app = create_app(ctx)
    # A generous limiter: the fuzzer sends many bad tokens from one address and
    # must reach the handlers; the limiter has its own test.
    app.state.limiter.max_failures = 10**9
    # The fuzzer draws `lease?wait_s=` up to its 60 s maximum; a long-poll that waits is
    # tested in tests/api/test_long_poll.py. Here every lease answers at once (as on a
    # stopping server), so the client's read timeout measures handlers, not waits.
    ctx.lease_waiters.close()
    client = TestClient(app)
    join = issue_token(ctx, "join", pool="gpu-pool", ttl=timedelta(hours=1))
    reg = client.post(
        "/api/v1/workers/register",
        headers={"Authorization": f"Bearer {join}"},
        json={"hostname": "h", "instance_id": "i-fuzz", "provider": "fake", "pool": "gpu-pool"},
    )
    assert reg.status_code == 201, reg.text
    team = issue_token(ctx, "team", team="vision")
    task = client.post(
        "/api/v1/tasks", headers={"Authorization": f"Bearer {team}"}, json={"queue": "gpu", "command": ["true"]}
    )
    assert task.status_code == 201, task.text
    return {
        "app": app,
        "tokens": {
            "none": None,
            "bad": "asa_not-a-real-token",
            "admin": issue_token(ctx, "admin"),
            "team": team,
            "worker": reg.json()["worker_token"],
        },
        "ids": {"worker_id": reg.json()["worker_id"], "task_id": task.json()["id"]},
    }


def _operations(app: Any) -> list[Any]:
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    ops = [result.ok() for result in schema.get_all_operations()]
    assert len(ops) >= 20, "the spec lost its operations"
    return ops


def _exercise(op: Any, world: dict[str, Any], examples: int) -> None:
    @given(case=op.as_strategy(), use_real_ids=st.booleans())
    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def run(case: Any, use_real_ids: bool) -> None:
        # Half the examples use the real ids so handlers past the lookup run too.
        if use_real_ids and case.path_parameters:
            for key, value in world["ids"].items():
                if key in case.path_parameters:
                    case.path_parameters[key] = value
        for role, token in world["tokens"].items():
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            response = case.call(headers=headers)
            assert response.status_code < 500, (
                f"{role}: {case.method} {case.formatted_path} -> {response.status_code} {response.text[:300]}"
            )
            case.validate_response(response, checks=CHECKS, headers=headers)

    run()


def test_every_operation_every_role(fuzz_world: dict[str, Any]) -> None:
    failures = []
    for op in _operations(fuzz_world["app"]):
        try:
            _exercise(op, fuzz_world, CI_EXAMPLES)
        except Exception as exc:  # collect all operations' failures, then fail once
            failures.append(f"{op.label}: {exc!r}"[:1500])
    assert not failures, "\n\n".join(failures)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_every_operation_every_role_long(fuzz_world: dict[str, Any]) -> None:
    for op in _operations(fuzz_world["app"]):
        _exercise(op, fuzz_world, 200)
