"""Record: the decision row every cycle writes (what was seen, what the policy said, what
was planned and done, and why in plain words), history points for charts, and spend.

`explain_lines` turns a cycle into the sentences `autoscaler explain` prints, e.g.
"held 4 task(s) of team vision in queue gpu: team vision may not scale up: 92 % of its
10,000 USD monthly budget; scale-up frozen by budgets.rego".
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Collection
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from autoscaler.config import NotificationsConfig
from autoscaler.ledger.spend import accrue
from autoscaler.notify.due import record_due
from autoscaler.policy.schema import EvaluationResult
from autoscaler.state.models import DecisionRecord, HistoryPoint

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from autoscaler.reconciler.cycle import CycleResult
    from autoscaler.reconciler.snapshot import Snapshot

# A plan at 10,000 tasks can name thousands of machines; the record keeps a bounded head.
MAX_LISTED = 200


def explain_lines(snap: Snapshot, evaluation: EvaluationResult, result: CycleResult) -> list[str]:
    p = result.plan
    lines: list[str] = []
    decision = evaluation.decision
    if evaluation.error:
        lines.append(
            f"policy failed safe (revision {evaluation.revision or '?'}): {evaluation.error}; "
            "no team may grow until it is fixed, running work is kept"
        )
    for team, td in sorted(decision.teams.items()):
        if td.reasons and (not td.may_scale_up or td.drain or td.spend_headroom_per_hour is not None):
            lines.append(f"team {team}: " + "; ".join(td.reasons))
    for alert in decision.alerts:
        who = f"team {alert.team}" if alert.team else "fleet"
        lines.append(f"alert ({alert.level}, {who}): {alert.message}")
    lines.extend(f"policy warns: {w}" for w in decision.warn)
    lines.extend(f"policy denies: {d}" for d in decision.deny)
    grouped = Counter((x.team, x.pool, x.offering.key, x.reason.split(";")[0]) for x in p.launches)
    for (team, pool, key, why), n in grouped.items():
        lines.append(f"launch {n} x {key} in pool {pool} for team {team}: {why}")
    lines.extend(
        f"launch failed: {e}; that offering is unavailable for a while, the next cycle falls back"
        for e in result.launch_errors
    )
    for h in p.holds:
        gpus = f", {h.gpus} GPU(s)" if h.gpus else ""
        lines.append(f"hold {h.tasks} task(s){gpus} of team {h.team} in queue {h.queue}: {h.reason}")
    for d in p.drains:
        lines.append(f"drain worker {d.worker_id} in pool {d.pool}: {d.reason}")
    lines.extend(f"drain refused: {r}" for r in result.drains_refused)
    for t in p.terminations:
        lines.append(f"terminate instance {t.instance_id} in pool {t.pool}: {t.reason}")
    lines.extend(
        f"adopted instance {i} after a restart (its request id matched a launch intent)" for i in result.adopted
    )
    lines.extend(
        f"terminated orphan {o}: carries this deployment's owner tag but has no record" for o in result.orphans
    )
    lines.extend(f"instance {i} preempted by the provider" for i in result.preempted)
    lines.extend(f"instance {i} lost: the provider no longer lists it" for i in result.lost)
    lines.extend(p.notes)
    if not (p.launches or p.holds or p.drains or p.terminations or result.launch_errors):
        pending = sum(g.count for g in snap.demand)
        if pending:
            lines.append(
                f"no change: {pending} queued task(s) fit the {p.placed_on_existing} free slot(s) "
                "of running or booting capacity"
            )
        else:
            lines.append("no change: nothing queued, and no idle worker is past its idle timeout")
    return lines


def _decision_summary(evaluation: EvaluationResult) -> dict[str, Any]:
    d = evaluation.decision
    return {
        "revision": evaluation.revision,
        "decision_id": evaluation.decision_id,
        "fail_safe": d.fail_safe,
        "error": evaluation.error,
        "teams": {
            name: {
                "may_scale_up": td.may_scale_up,
                "spend_headroom_per_hour": td.spend_headroom_per_hour,
                "priority_tier": td.priority_tier,
                "priority_weight": td.priority_weight,
                "drain": td.drain,
                "allowed_capacity_types": td.allowed_capacity_types,
                "reasons": td.reasons,
            }
            for name, td in d.teams.items()
        },
        "alerts": [a.model_dump() for a in d.alerts],
        "deny": d.deny,
        "warn": d.warn,
    }


def _bounded(plan_dict: dict[str, Any]) -> dict[str, Any]:
    out = dict(plan_dict)
    for key in ("launches", "drains", "terminations", "holds"):
        items = out.get(key, [])
        out[f"{key}_count"] = len(items)
        out[key] = items[:MAX_LISTED]
    return out


def _counts(result: CycleResult) -> dict[str, Any]:
    p = result.plan
    return {
        "launches_count": len(p.launches),
        "drains_count": len(p.drains),
        "terminations_count": len(p.terminations),
        "holds_count": len(p.holds),
    }


def record_cycle(
    s: Session,
    *,
    now: datetime,
    snap: Snapshot,
    evaluation: EvaluationResult,
    result: CycleResult,
    history: bool,
    accrue_since: datetime | None,
    detail: bool = True,
    shared: Collection[str] = (),
    notifications: NotificationsConfig | None = None,
) -> int:
    """Write the cycle's decision row (and history points when `history`).

    `detail=False` is for the simulator, which writes tens of thousands of rows nobody
    reads: the row keeps what the decision was (revision, digest, policy result,
    outcome, plan counts) but not the snapshot summary, the plan's item lists or the
    explanation sentences, which cost more to build than the rest of the record. Spend
    is accrued either way: the ledger feeds the next cycle's policy input.

    With `notifications`, the alerts this cycle makes due are recorded in the same
    transaction (`autoscaler.notify.due`); a separate job delivers them.
    """
    accrue(s, now=now, since=accrue_since, shared=shared)
    summary: dict[str, Any] = {
        **(snap.summary() if detail else {}),
        "timings_ms": {k: round(v, 3) for k, v in result.timings_ms.items()},
        "outcome": {
            "launched": len(result.launched),
            "launch_errors": result.launch_errors[:MAX_LISTED],
            "drained": len(result.drained),
            "drains_refused": result.drains_refused[:MAX_LISTED],
            "terminated": len(result.terminated),
            "adopted": result.adopted[:MAX_LISTED],
            "orphans": result.orphans[:MAX_LISTED],
            "lost": result.lost[:MAX_LISTED],
            "preempted": result.preempted[:MAX_LISTED],
        },
    }
    row = DecisionRecord(
        at=now,
        policy_revision=evaluation.revision[:64],
        input_digest=evaluation.input_digest[:64],
        eval_ms=evaluation.eval_ms,
        cycle_ms=result.timings_ms.get("total", 0.0),
        summary=summary,
        result=_decision_summary(evaluation),
        plan=_bounded(result.plan.to_dict()) if detail else _counts(result),
        reasons=explain_lines(snap, evaluation, result)[:MAX_LISTED] if detail else [],
        error=evaluation.error,
    )
    s.add(row)
    if history:
        _history(s, now, snap)
    s.flush()
    if notifications is not None and detail:
        try:
            # A savepoint: a bug in working out alerts must not cost the cycle its record.
            with s.begin_nested():
                record_due(s, now=now, snap=snap, evaluation=evaluation, result=result, config=notifications)
        except Exception:
            log.exception("recording this cycle's alerts failed; the next cycle records them")
    return row.id


def _history(s: Session, now: datetime, snap: Snapshot) -> None:
    """A few points per cycle for the dashboard's charts (bounded by pools x states + teams)."""
    depth: Counter[str] = Counter()
    for g in snap.demand:
        depth[g.queue] += g.count
    for q in snap.queues:
        s.add(HistoryPoint(at=now, metric="queue_depth", key=q.name, value=float(depth.get(q.name, 0))))
    fleet = Counter((i.pool, i.state) for i in snap.instances)
    for (pool, state), n in fleet.items():
        s.add(HistoryPoint(at=now, metric="fleet_instances", key=f"{pool}/{state}", value=float(n)))
    for team, usd in snap.month_to_date.items():
        s.add(HistoryPoint(at=now, metric="spend_mtd_usd", key=team, value=round(usd, 4)))
    for team, usd in snap.burn.items():
        s.add(HistoryPoint(at=now, metric="burn_usd_per_hour", key=team, value=round(usd, 4)))
