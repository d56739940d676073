"""In-process instruments, on a registry of their own (not the global default, so
tests and several apps in one process never collide over metric names)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

PROCESS_REGISTRY = CollectorRegistry(auto_describe=True)

RECONCILE_CYCLE = Histogram(
    "autoscaler_reconcile_cycle_seconds",
    "Duration of one reconcile cycle (observe, decide, plan, act, record).",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
    registry=PROCESS_REGISTRY,
)
POLICY_EVALUATION = Histogram(
    "autoscaler_policy_evaluation_seconds",
    "Duration of one policy evaluation.",
    buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2, 5),
    registry=PROCESS_REGISTRY,
)
POLICY_FAILURES = Counter(
    "autoscaler_policy_evaluation_failures",
    "Policy evaluations that failed (the fail-safe decision was used).",
    registry=PROCESS_REGISTRY,
)
PROVIDER_ERRORS = Counter(
    "autoscaler_provider_errors",
    "Provider calls that failed, by provider and error type.",
    ["provider", "kind"],
    registry=PROCESS_REGISTRY,
)


def observe_cycle(seconds: float) -> None:
    RECONCILE_CYCLE.observe(max(0.0, seconds))


def policy_eval(seconds: float, ok: bool) -> None:
    POLICY_EVALUATION.observe(max(0.0, seconds))
    if not ok:
        POLICY_FAILURES.inc()


def provider_error(provider: str, kind: str) -> None:
    # Label values are bounded by the provider list and the typed error names;
    # truncation guards against a caller passing a free-text message by mistake.
    PROVIDER_ERRORS.labels(provider=provider[:32], kind=kind[:64]).inc()
