"""GPU autoscaler and policy service: elastic queues, Rego budgets, spot/on-demand fleets."""

__version__ = "0.1.0"
