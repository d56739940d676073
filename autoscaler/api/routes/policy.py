"""HTTP endpoints of the policy service: its status, and a reload for admins.

A refused reload is not an HTTP error: the request was valid and the service did the
right thing (kept the last good policy), so it answers 200 with `ok: false` and why.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from autoscaler.api.context import AppContext
from autoscaler.api.deps import Auth, Ctx, tx
from autoscaler.errors import NotFound
from autoscaler.policy.service import PolicyService

router = APIRouter(prefix="/api/v1", tags=["policy"])


class PolicyStatusOut(BaseModel):
    engine: str
    isolated: bool | None
    interpreter: str | None = None  # regorus or rego-cpp; None for OPA
    directory: str | None
    opa_url: str | None
    package: str
    revision: str
    loaded_at: datetime | None
    last_reload_at: datetime | None
    last_reload_error: str | None
    last_eval_error: str | None
    test_cases_passed: int
    modules: list[str] = Field(default_factory=list, description="Rego modules in force (embedded engine).")
    data: dict[str, Any] | None = Field(
        None, description="The policy data in force (budgets, priorities, placement); admins only."
    )


class ReloadOut(BaseModel):
    ok: bool
    revision: str
    candidate: str | None
    message: str
    test_cases_passed: int


def service_of(ctx: AppContext) -> PolicyService:
    service = ctx.policy
    if service is None:
        raise NotFound("the policy service is not running in this process (start it with `autoscaler up`)")
    return service


@router.get("/policy", response_model=PolicyStatusOut)
def policy_status(auth: Auth, ctx: Ctx) -> PolicyStatusOut:
    with tx(ctx) as s:
        principal = auth.user(s)
    service = service_of(ctx)
    modules, data = service.in_force()
    # Other teams' budgets and quotas are FinOps' business: a team token gets the rest.
    return PolicyStatusOut(**service.status(), modules=modules, data=data if principal.is_admin else None)


@router.post("/policy/reload", response_model=ReloadOut)
def policy_reload(auth: Auth, ctx: Ctx) -> ReloadOut:
    with tx(ctx) as s:
        auth.admin(s)
    outcome = service_of(ctx).reload()
    return ReloadOut(
        ok=outcome.ok,
        revision=outcome.revision,
        candidate=outcome.candidate,
        message=outcome.message,
        test_cases_passed=outcome.cases,
    )
