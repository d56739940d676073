"""Why is this task waiting? One answer, built from what the gates and the planner
decided. Pure: `autoscaler.admission.why_db.why_task` gathers the facts.

The answer is the first of these that holds for a queued task (each with its
numbers): the policy failed (fail-safe), the team is drained, the policy keeps the
team out of every pool of the task's queue, the team is at its GPU quota, a booting
machine will take it, the team may not add spend (budget), the last plan held it for
another reason (no shape fits, pool at its max...), tasks ahead of it in its pools,
or no reason known. A task that is not queued says what it is doing instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from autoscaler.admission.fit import Need
from autoscaler.admission.gate import Machine, refusal
from autoscaler.admission.model import TeamAdmission, launched_for
from autoscaler.admission.quota import Quota, cap
from autoscaler.admission.right_size import Size, held_back
from autoscaler.lifecycle import TASK_ACTIVE

CODES = (
    "policy_failed",
    "drained",
    "placement",
    "quota",
    "booting",
    "budget",
    "no_fit",
    "behind",
    "not_queued",
    "unknown",
)


@dataclass(frozen=True, slots=True)
class TaskFacts:
    id: str
    team: str
    queue: str
    state: str
    gpus: int
    created_at: datetime
    worker_id: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    end_reason: str | None = None
    exit_code: int | None = None
    cpus: float = 0.0
    memory_mb: int = 0


@dataclass(frozen=True, slots=True)
class Booting:
    """An instance in requested/launching/booting in one of the queue's pools."""

    id: str
    pool: str
    state: str
    gpus: int
    since: datetime
    boot_timeout_s: float
    hourly_price: float = 0.0
    team: str | None = None
    capacity_type: str | None = None
    # Typical seconds from launch to ready in this pool (None: no history).
    typical_boot_s: float | None = None
    smaller: tuple[Size, ...] = ()  # `admission.right_size`: it will not take work a smaller machine fits


@dataclass(frozen=True, slots=True)
class Spend:
    month_to_date_usd: float
    burn_usd_per_hour: float


@dataclass(frozen=True, slots=True)
class Why:
    code: str
    reason: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "reason": self.reason, "details": self.details}


def _ts(at: datetime | None) -> str:
    return at.isoformat(timespec="seconds") if at is not None else "?"


def _not_queued(task: TaskFacts) -> Why:
    details: dict[str, Any] = {"state": task.state}
    if task.state in TASK_ACTIVE:
        since = task.started_at
        text = f"not waiting: {task.state} on worker {task.worker_id or '?'}" + (
            f" since {_ts(since)}" if since else ""
        )
        details.update(worker_id=task.worker_id, since=_ts(since) if since else None)
    else:
        text = f"not waiting: {task.state}"
        if task.finished_at is not None:
            text += f" at {_ts(task.finished_at)}"
            details["finished_at"] = _ts(task.finished_at)
        if task.end_reason:
            text += f" ({task.end_reason}"
            text += f", exit code {task.exit_code})" if task.exit_code is not None else ")"
            details["end_reason"] = task.end_reason
    return Why("not_queued", text, details)


def _hold_code(reason: str) -> str:
    text = reason.lower()
    if text.startswith("policy could not be evaluated"):
        return "policy_failed"
    if "quota:" in text:
        return "quota"
    if "spend headroom" in text or "may not scale up" in text or "budget" in text or "may not add spend" in text:
        return "budget"
    if "policy keeps team" in text and all(
        part.strip().startswith("policy keeps team") for part in text.split(";") if part.strip()
    ):
        return "placement"
    return "no_fit"


def _budget_text(adm: TeamAdmission, spend: Spend | None) -> tuple[str, dict[str, Any]]:
    details: dict[str, Any] = {
        "may_scale_up": adm.may_scale_up,
        "headroom_usd_per_hour": adm.headroom_usd_per_hour,
        "reasons": list(adm.reasons),
    }
    parts = []
    if not adm.may_scale_up:
        parts.append("the policy froze its growth")
    elif adm.headroom_usd_per_hour is not None:
        parts.append(f"{adm.headroom_usd_per_hour:.2f} USD/h of spend headroom left")
    if spend is not None:
        parts.append(f"spend {spend.month_to_date_usd:.2f} USD this month, burning {spend.burn_usd_per_hour:.2f} USD/h")
        details.update(month_to_date_usd=round(spend.month_to_date_usd, 4), burn_usd_per_hour=spend.burn_usd_per_hour)
    parts.extend(adm.reasons)
    return f"held by its team's budget: team {adm.team} may not add spend (" + "; ".join(parts) + ")", details


def explain_task(
    task: TaskFacts,
    *,
    admission: TeamAdmission | None,
    quotas: Mapping[str, Quota],
    held_gpus: Mapping[str, int],
    queue_pools: Sequence[str],
    holds: Sequence[Mapping[str, Any]],
    booting: Sequence[Booting],
    ahead: int,
    spend: Spend | None,
    decided_at: datetime | None,
    now: datetime,
) -> Why:
    """The current reason `task` waits (see the module docstring for the order).

    `holds` are the last decision's holds for the task's (team, queue); `held_gpus`
    the GPUs each team's leased and running tasks hold; `booting` the instances not
    yet ready in the queue's pools with GPUs enough for the task; `ahead` the queued
    tasks that a worker of those pools would lease before this one."""
    if task.state != "queued":
        return _not_queued(task)
    adm = admission
    if adm is not None and adm.fail_safe:
        return Why(
            "policy_failed",
            "the policy could not be evaluated: no team may add spend until it is fixed; running work is kept",
            {"reasons": list(adm.reasons)},
        )
    if adm is not None and adm.drain:
        why = "; ".join(adm.reasons) or "the policy drains it"
        return Why("drained", f"team {adm.team} is being drained ({why})", {"reasons": list(adm.reasons)})
    if adm is not None:
        allowed = adm.allowed_pools
        shut_out = allowed is not None and not set(queue_pools) & set(allowed)
        out = None
        if not queue_pools:
            out = f"queue {task.queue} has no pool"
        elif shut_out:
            out = (
                f"policy keeps team {adm.team} out of every pool of queue {task.queue} "
                f"({', '.join(queue_pools)}; allowed: {', '.join(allowed or ()) or 'none'})"
            )
        elif not adm.allowed_capacity_types:
            out = f"policy allows team {adm.team} no capacity type"
        if out is not None:
            return Why(
                "placement",
                out,
                {"queue_pools": list(queue_pools), "allowed_pools": list(allowed) if allowed is not None else None},
            )
    limit = cap(task.team, quotas, held_gpus) if task.team in quotas else None
    held = held_gpus.get(task.team, 0)
    if limit is not None and task.gpus > 0 and held + task.gpus > limit:
        q = quotas[task.team]
        borrow = limit - max(q.nominal_gpus, 0)
        return Why(
            "quota",
            f"over quota: team {task.team} holds {held} GPU(s); its cap now is {limit} "
            f"(nominal {q.nominal_gpus} + {borrow} borrowable"
            + (f", borrowing limit {q.borrowing_limit_gpus}" if q.borrowing_limit_gpus is not None else "")
            + f"), this task needs {task.gpus}",
            {
                "held_gpus": held,
                "cap_gpus": limit,
                "nominal_gpus": q.nominal_gpus,
                "borrowable_gpus": borrow,
                "borrowing_limit_gpus": q.borrowing_limit_gpus,
                "needs_gpus": task.gpus,
            },
        )
    room = None if limit is None else max(limit - held, 0)
    for inst in sorted(booting, key=lambda b: b.since):
        if held_back(Need(task.gpus, None, task.cpus, task.memory_mb), inst.smaller):
            continue  # bought for larger work: a right-sized machine is on its way
        if adm is not None:
            machine = Machine(inst.pool, inst.gpus, inst.hourly_price, launched_for(inst.team), inst.capacity_type)
            if refusal(adm, machine, task.gpus, room) is not None:
                continue
        elapsed = max((now - inst.since).total_seconds(), 0.0)
        if inst.typical_boot_s is not None:
            eta = max(inst.typical_boot_s - elapsed, 0.0)
            eta_text = f"ETA about {eta:.0f} s (typical boot in pool {inst.pool}: {inst.typical_boot_s:.0f} s)"
        else:
            eta = max(inst.boot_timeout_s - elapsed, 0.0)
            eta_text = f"ready within {eta:.0f} s at the latest (no boot history in pool {inst.pool})"
        return Why(
            "booting",
            f"waiting for machine {inst.id} ({inst.state} in pool {inst.pool}, {inst.gpus} GPU(s)) booting since "
            f"{_ts(inst.since)}, boot timeout {inst.boot_timeout_s:g} s, {eta_text}",
            {
                "instance_id": inst.id,
                "pool": inst.pool,
                "state": inst.state,
                "since": _ts(inst.since),
                "boot_timeout_s": inst.boot_timeout_s,
                "eta_s": round(eta, 1),
                "eta_from_history": inst.typical_boot_s is not None,
            },
        )
    budget_holds = [h for h in holds if _hold_code(str(h.get("reason", ""))) == "budget"]
    if adm is not None and (adm.frozen or budget_holds):
        text, details = _budget_text(adm, spend)
        if budget_holds:
            details["hold"] = str(budget_holds[0].get("reason"))
        return Why("budget", text, details)
    if holds:
        h = holds[0]
        reason = str(h.get("reason", ""))
        code = _hold_code(reason)
        text = (
            f"held by the last plan ({_ts(decided_at)}) with {h.get('tasks', 0)} task(s) of team {task.team} "
            f"in queue {task.queue}: {reason}"
        )
        return Why(code, text, {"hold": reason, "held_tasks": h.get("tasks", 0), "held_gpus": h.get("gpus", 0)})
    if ahead > 0:
        return Why(
            "behind",
            f"behind {ahead} task(s) of higher priority or older in the pools of queue {task.queue}",
            {"ahead": ahead},
        )
    if decided_at is None or task.created_at > decided_at:
        return Why("unknown", "queued after the last reconcile cycle: the next cycle plans for it", {})
    return Why("unknown", "no reason recorded: a fitting worker should lease it on its next poll", {})


def standing(adm: TeamAdmission, held_gpus: int, cap_gpus: int | None) -> str:
    """A team's current admission in one sentence ("may grow" only when it may)."""
    why = "; ".join(adm.reasons)
    tail = f" ({why})" if why else ""
    if adm.fail_safe:
        return "may not grow: the policy could not be evaluated (fail-safe)"
    if adm.drain:
        return f"may not grow: being drained{tail}"
    if not adm.may_scale_up:
        return f"may not grow: frozen by the policy{tail}"
    if adm.headroom_usd_per_hour is not None and adm.headroom_usd_per_hour <= 1e-9:
        return f"may not grow: spend headroom used up{tail}"
    if cap_gpus is not None and held_gpus >= cap_gpus:
        return f"may not grow: at its GPU quota (holds {held_gpus} of {cap_gpus} GPU(s)){tail}"
    parts = []
    if adm.headroom_usd_per_hour is not None:
        parts.append(f"{adm.headroom_usd_per_hour:.2f} USD/h of spend headroom")
    if cap_gpus is not None:
        parts.append(f"{cap_gpus - held_gpus} more GPU(s) within quota")
    return "may grow" + (f" ({', '.join(parts)})" if parts else "") + (f"; {why}" if why else "")
