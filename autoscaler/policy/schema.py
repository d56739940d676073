"""The versioned contract between the control plane and its policies.

`PolicyInput` is what a reconcile cycle shows the policy (spend, demand, pools);
`Decision` is what the policy answers (per team: may it grow, by how much money per
hour, on which capacity types and pools, with which priority; per pool: caps; alerts;
`deny`/`warn` messages). Both are exported as JSON Schema into `docs/schemas/` so that
a FinOps team writing its own Rego, or an OPA server, codes against the same shapes.

Bump `SCHEMA_VERSION` only for an incompatible change; adding a field with a default
is compatible. Decision models refuse unknown keys: a policy that writes
`may_scaleup` would otherwise be silently ignored, which is exactly the kind of
mistake that spends money.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION: Literal["1"] = "1"
Level = Literal["info", "warning", "critical"]
Basis = Literal["actual", "forecast"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------- input


class TeamInput(_Model):
    """One team's money and demand, as the ledger and the queues see it this cycle."""

    name: str
    priority_weight: float = Field(1.0, description="Configured weight; the policy may override it.")
    monthly_budget_usd: float | None = Field(
        None, description="Informational only: budgets live in the policy data (policies/data/teams.yaml)."
    )
    month_to_date_usd: float = Field(0.0, ge=0, description="Spend charged to the team since the 1st (UTC).")
    burn_rate_usd_per_hour: float = Field(0.0, ge=0, description="USD/h of the team's capacity running now.")
    forecast_usd: float = Field(
        0.0, ge=0, description="Month-end projection: month_to_date_usd + burn x hours left in the period."
    )
    running_gpus: int = Field(0, ge=0)
    pending_gpus: int = Field(0, ge=0)


class QueueInput(_Model):
    """One elastic queue: its backlog and who is waiting in it."""

    name: str
    pools: list[str] = Field(default_factory=list, description="Serving pools, in preference order.")
    priority: int = 0
    depth: int = Field(0, ge=0, description="Tasks queued (not yet leased).")
    running: int = Field(0, ge=0)
    oldest_wait_s: float | None = Field(None, ge=0, description="Oldest queued task age.")
    teams_waiting: list[str] = Field(default_factory=list)
    pending_gpus_by_shape: dict[str, int] = Field(
        default_factory=dict, description='GPUs wanted by queued tasks, by shape such as "1xA100" or "2xany".'
    )


class SpotOfferingInput(_Model):
    """One spot offering of a pool and its observed reclaim rate (the ledger's estimate:
    a prior from config, old evidence decaying; docs/capacity.md)."""

    instance_type: str
    zone: str | None = None
    reclaim_rate_per_hour: float = Field(ge=0, description="Estimated reclaims per instance-hour.")
    reclaim_rate_sd: float = Field(0.0, ge=0, description="Its standard deviation (inf: no evidence, no prior).")
    instance_hours: float = Field(0.0, ge=0, description="Spot instance-hours observed, after decay.")
    reclaims: float = Field(0.0, ge=0, description="Reclaims observed among them, after decay.")


class PoolInput(_Model):
    """One pool of machines and what its capacity costs."""

    name: str
    provider: str
    region: str = "local"
    kind: Literal["static", "cloud"] = "cloud"
    capacity_types: list[str] = Field(default_factory=lambda: ["spot", "on_demand"])
    min_instances: int = Field(0, ge=0)
    max_instances: int = Field(0, ge=0)
    current_instances: int = Field(0, ge=0)
    idle_instances: int = Field(0, ge=0, description="Instances whose worker is idle (used by on-prem first).")
    backlog: int = Field(0, ge=0, description="Derived by the service: tasks queued in the queues this pool serves.")
    onprem_idle_peers: int = Field(
        0, ge=0, description="Derived by the service: idle on-prem instances serving a queue this pool serves."
    )
    hourly_prices: dict[str, float] = Field(
        default_factory=dict, description='USD/h keyed "<instance_type>/<capacity_type>" ("g5.xlarge/spot").'
    )
    spot_offerings: list[SpotOfferingInput] = Field(
        default_factory=list, description="The pool's spot offerings with their observed reclaim rates."
    )


class PolicyInput(_Model):
    """Everything a policy may look at for one decision. Times are UTC."""

    schema_version: Literal["1"] = SCHEMA_VERSION
    now: datetime
    billing_period_start: datetime = Field(description="The first instant of the calendar month (UTC).")
    billing_period_end: datetime = Field(description="The first instant of the next month (UTC).")
    hours_left_in_period: float = Field(ge=0)
    teams: list[TeamInput] = Field(default_factory=list)
    queues: list[QueueInput] = Field(default_factory=list)
    pools: list[PoolInput] = Field(default_factory=list)
    fleet: dict[str, int] = Field(
        default_factory=dict, description="Fleet summary counts (instances, gpus, idle_workers...)."
    )
    pools_by_price: list[str] = Field(
        default_factory=list,
        description=(
            "Derived by the service: the pool names by their cheapest hourly price (0 for a pool "
            "without prices), then by name."
        ),
    )


# ---------------------------------------------------------------- decision


class TeamDecision(_Model):
    """What one team may do this cycle. The defaults are the permissive answer."""

    may_scale_up: bool = True
    spend_headroom_per_hour: float | None = Field(
        None, description="USD/h of NEW capacity the team may add this cycle; None = unlimited."
    )
    allowed_capacity_types: list[str] = Field(default_factory=lambda: ["spot", "on_demand"])
    allowed_pools: list[str] | None = Field(None, description="None = every pool.")
    priority_tier: int = Field(0, description="Higher tiers are served first when capacity is short.")
    priority_weight: float = Field(1.0, description="Weighted fair share within a tier.")
    drain: bool = Field(False, description="Hard budget reached: drain the team's running capacity.")
    max_spot_price: float | None = Field(None, description="USD/h cap on a spot offering; None = no cap.")
    nominal_gpus: int | None = Field(None, description="GPUs the team is guaranteed (Kueue nominal quota).")
    borrowing_limit_gpus: int | None = Field(
        None,
        description=(
            "GPUs the team may borrow beyond nominal until the next evaluation (what others leave unused, "
            "within its limit); the gates lower it further as the cohort's use changes. None = no limit."
        ),
    )
    lending_limit_gpus: int | None = Field(
        None, description="At most this many of the team's unused nominal GPUs are lent to others; None = all."
    )
    reasons: list[str] = Field(default_factory=list)


class PoolDecision(_Model):
    max_instances: int | None = None
    min_instances: int | None = None
    reasons: list[str] = Field(default_factory=list)


class QueueDecision(_Model):
    allowed_pools: list[str] | None = Field(None, description="None = every pool the queue is configured with.")
    reasons: list[str] = Field(default_factory=list)


class Alert(_Model):
    team: str | None = None
    level: Level
    threshold_pct: float
    basis: Basis
    message: str


class Decision(_Model):
    """The policy's answer. `team(name)` falls back to `default_team` for unknown teams."""

    schema_version: Literal["1"] = SCHEMA_VERSION
    teams: dict[str, TeamDecision] = Field(default_factory=dict)
    default_team: TeamDecision = Field(default_factory=TeamDecision)
    pools: dict[str, PoolDecision] = Field(default_factory=dict)
    queues: dict[str, QueueDecision] = Field(default_factory=dict)
    pool_order: list[str] = Field(
        default_factory=list, description="Pools in the order to use them: on-prem first, then cheapest."
    )
    alerts: list[Alert] = Field(default_factory=list)
    deny: list[str] = Field(default_factory=list)
    warn: list[str] = Field(default_factory=list)
    fail_safe: bool = Field(False, description="True when the policy could not be evaluated.")
    error: str | None = None

    def team(self, name: str) -> TeamDecision:
        return self.teams.get(name, self.default_team)

    @classmethod
    def failed(cls, error: str, team_names: list[str] | None = None) -> Decision:
        """The fail-safe answer: no team may add capacity; nothing is drained.

        Running work is left alone on purpose: a broken policy must not turn into a
        fleet-wide outage, only into a pause of growth until it is fixed.
        """
        frozen = TeamDecision(may_scale_up=False, spend_headroom_per_hour=0.0, reasons=[f"policy failed: {error}"])
        return cls(
            teams={name: frozen.model_copy(deep=True) for name in team_names or []},
            default_team=frozen,
            fail_safe=True,
            error=error,
        )


class EvaluationResult(BaseModel):
    """A decision plus what the recorder needs to explain it later."""

    decision: Decision
    revision: str = Field(description="Content hash of the policy bundle that answered.")
    input_digest: str = Field(description="sha256 of the JSON document the engine was handed.")
    eval_ms: float
    decision_id: str | None = Field(None, description="OPA's decision id, when OPA answered.")
    error: str | None = None


class PolicyEngine(Protocol):
    """Evaluates one input. Never raises for a policy problem: it returns a fail-safe result."""

    @property
    def revision(self) -> str: ...

    def evaluate(self, policy_input: PolicyInput) -> EvaluationResult: ...

    def close(self) -> None: ...


def export_schemas() -> dict[str, dict[str, object]]:
    """JSON Schemas of the input, the decision and the shipped data files, as written
    to docs/schemas/ (the data files' models are in autoscaler/policy/data_schema.py)."""
    from autoscaler.policy.data_schema import export_data_schemas

    return {
        f"policy-input.v{SCHEMA_VERSION}.json": PolicyInput.model_json_schema(),
        f"policy-decision.v{SCHEMA_VERSION}.json": Decision.model_json_schema(),
        **export_data_schemas(SCHEMA_VERSION),
    }
