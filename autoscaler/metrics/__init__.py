"""Prometheus metrics: `/metrics` and the calls other components make to record
what only they see.

Components call, from any thread:
- `observe_cycle(seconds)` after each reconcile cycle;
- `policy_eval(seconds, ok)` after each policy evaluation (ok=False for a failure);
- `provider_error(provider, kind)` when a provider call fails (kind: the typed error's name).

Everything else (queues, tasks, fleet, spend, leases) is read from the database at
scrape time, so it is right whichever process did the work.
"""

from autoscaler.metrics.instruments import observe_cycle, policy_eval, provider_error

__all__ = ["observe_cycle", "policy_eval", "provider_error"]
