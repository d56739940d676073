"""The planner: a pure function from a snapshot and a policy decision to a plan.

No I/O, no clock reads, no globals: `plan(PlanInput) -> Plan`. The reconciler builds
the input from the database and providers and carries the plan out; the simulator
drives the very same function with a virtual clock.
"""

from autoscaler.planner.model import (
    DemandGroup,
    Drain,
    Hold,
    InstanceView,
    Launch,
    OfferingView,
    Plan,
    PlanInput,
    PoolView,
    QueueView,
    Terminate,
    WorkerView,
)
from autoscaler.planner.plan import plan

__all__ = [
    "DemandGroup",
    "Drain",
    "Hold",
    "InstanceView",
    "Launch",
    "OfferingView",
    "Plan",
    "PlanInput",
    "PoolView",
    "QueueView",
    "Terminate",
    "WorkerView",
    "plan",
]
