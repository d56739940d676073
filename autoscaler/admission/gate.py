"""May this team start this much work on this machine? Pure; the planner and the
lease ask it the same way.

Money follows the ledger's attribution: GPUs a task holds are charged to the task's
team; a machine's free GPUs are charged to the team whose demand launched it (or to
the pool's `shared` line). So work placed on a machine already charged to its own
team adds nothing to that team's spend (it only moves cost from "unused" to "used"),
while work placed anywhere else adds the GPUs' share of the machine's price and needs
the team's spend headroom. A team the policy drains gets nothing, anywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoscaler.admission.model import TeamAdmission
from autoscaler.admission.right_size import Size


@dataclass(frozen=True, slots=True)
class Machine:
    """The machine a task would run on, as the gate sees it."""

    pool: str
    gpus: int
    hourly_price: float = 0.0
    # The team its unused time is charged to (the team whose demand launched it);
    # None: the pool's shared line, or a machine we do not pay by the hour (static).
    charged_team: str | None = None
    capacity_type: str | None = None  # None: not a cloud offering (static, Slurm)
    # Pool tenancy "team": the machine runs one team's work at a time, its `tenant`'s
    # (the team it was launched for, else the team whose work holds it now; None: free).
    exclusive: bool = False
    tenant: str | None = None
    # The smaller machines of its pool a GPU task that fits one waits for rather than
    # take this one whole (`admission.right_size`); empty: no such rule here.
    smaller: tuple[Size, ...] = ()

    def usd_per_hour(self, gpus: int) -> float:
        """What holding `gpus` of it costs per hour (a GPU-less machine is one slot)."""
        if self.hourly_price <= 0:
            return 0.0
        if self.gpus <= 0:
            return self.hourly_price
        return self.hourly_price * gpus / self.gpus


def added_spend(adm: TeamAdmission, machine: Machine, gpus: int) -> float:
    """USD/h the team's spend grows by if it holds `gpus` of `machine`."""
    if machine.charged_team is not None and machine.charged_team == adm.team:
        return 0.0
    return machine.usd_per_hour(gpus)


def placement_refusal(adm: TeamAdmission, machine: Machine) -> str | None:
    """Why the team may not run anything on this machine at all, or None."""
    if adm.drain:
        why = "; ".join(adm.reasons) or "the policy drains it"
        return f"team {adm.team} is being drained ({why})"
    if machine.exclusive and machine.tenant is not None and machine.tenant != adm.team:
        return f"machine belongs to team {machine.tenant} (pool {machine.pool} has tenancy: team)"
    if adm.allowed_pools is not None and machine.pool not in adm.allowed_pools:
        return f"policy keeps team {adm.team} out of pool {machine.pool}"
    if machine.capacity_type is not None and machine.capacity_type not in adm.allowed_capacity_types:
        return f"policy keeps team {adm.team} off {machine.capacity_type} capacity"
    return None


def spend_refusal(adm: TeamAdmission, added_usd_per_hour: float) -> str | None:
    """Why the team may not add this much spend, or None."""
    if added_usd_per_hour <= 1e-12:
        return None
    if adm.fail_safe:
        return "the policy could not be evaluated: no new spend until it can"
    if not adm.may_scale_up:
        why = "; ".join(adm.reasons) or "the policy froze its growth"
        return f"team {adm.team} may not add spend ({why})"
    left = adm.headroom_usd_per_hour
    if left is not None and added_usd_per_hour > left + 1e-9:
        return (
            f"spend headroom: {left:.2f} USD/h left for team {adm.team}, this would add {added_usd_per_hour:.2f} USD/h"
        )
    return None


def refusal(adm: TeamAdmission, machine: Machine, gpus: int, quota_room: int | None) -> str | None:
    """Why `gpus` GPUs of work of this team may not start on `machine`, or None."""
    why = placement_refusal(adm, machine)
    if why:
        return why
    if quota_room is not None and gpus > quota_room:
        return f"quota: team {adm.team} may add {quota_room} more GPU(s) now, this needs {gpus}"
    return spend_refusal(adm, added_spend(adm, machine, gpus))


def largest_admissible(adm: TeamAdmission, machine: Machine, quota_room: int | None) -> int | None:
    """The most GPUs one task of this team may take on `machine` (0: GPU-less work
    only), or None when nothing of the team may start there. Equivalent to asking
    `refusal` for every size, which the lease cannot afford per row."""
    if placement_refusal(adm, machine) is not None:
        return None
    limit = machine.gpus if machine.gpus > 0 else 0
    if quota_room is not None:
        limit = min(limit, quota_room)
    if machine.gpus <= 0:
        # One slot: the task holds the whole machine, whatever it asks for.
        return 0 if spend_refusal(adm, added_spend(adm, machine, 1)) is None else None
    per_gpu = added_spend(adm, machine, 1)
    if per_gpu > 1e-12 and spend_refusal(adm, per_gpu) is not None:
        return 0  # not even one GPU: GPU-less work on it adds nothing
    if per_gpu > 1e-12 and adm.headroom_usd_per_hour is not None:
        limit = min(limit, math.floor((adm.headroom_usd_per_hour + 1e-9) / per_gpu))
    return max(limit, 0)


def gang_limits(adm: TeamAdmission, machine: Machine, quota_room: int | None) -> tuple[int, int | None] | None:
    """For a multi-node task (a gang) of this team, one rank of which would go on
    `machine`: (the most GPUs per rank here, the most GPUs the whole gang may hold;
    None: unbounded), or None when nothing of the team may start there.

    The whole gang is admitted or none of it, so its quota and its spend are asked for
    `nodes x gpus` at once (each rank priced as this machine); the per-rank limit is
    only the machine's size. `largest_admissible` answers the same for one task."""
    if placement_refusal(adm, machine) is not None:
        return None
    per_rank = machine.gpus if machine.gpus > 0 else 0
    total: int | None = quota_room
    per_gpu = added_spend(adm, machine, 1)
    if per_gpu > 1e-12:
        if spend_refusal(adm, per_gpu) is not None:
            total = 0
        elif adm.headroom_usd_per_hour is not None:
            cap = math.floor((adm.headroom_usd_per_hour + 1e-9) / per_gpu)
            total = cap if total is None else min(total, cap)
    return per_rank, total
