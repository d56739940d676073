"""GPU quotas with borrowing and lending, in Kueue's terms. Pure.

Every team with a `nominal_gpus` quota belongs to one cohort. A team may always hold
its nominal quota. Beyond it, it may borrow what the other teams of the cohort leave
unused, at most `borrowing_limit_gpus` (None: no limit), and a lender lends at most
`lending_limit_gpus` of its unused quota (None: all of it). GPUs a team holds are
those of its leased and running tasks, plus, inside the planner, those the plan is
about to give it. A team without a quota is not limited by GPU counts.

The cohort keeps `sum(borrowed) <= sum(lendable)`. When a lender takes its quota back
(its own work starts within its nominal), that can stop holding: `over_borrowed`
says by how many GPUs, and the borrowers' newest work is reclaimed (drained like a
spot notice: SIGTERM, `interrupted:reclaim`, requeued).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Quota:
    nominal_gpus: int
    borrowing_limit_gpus: int | None = None
    lending_limit_gpus: int | None = None


def lendable(quota: Quota, held: int) -> int:
    unused = max(quota.nominal_gpus - held, 0)
    return unused if quota.lending_limit_gpus is None else min(unused, max(quota.lending_limit_gpus, 0))


def borrowed(quota: Quota, held: int) -> int:
    return max(held - quota.nominal_gpus, 0)


def cap(team: str, quotas: Mapping[str, Quota], held: Mapping[str, int]) -> int | None:
    """The most GPUs `team` may hold now, or None without a quota."""
    q = quotas.get(team)
    if q is None:
        return None
    free_to_borrow = 0
    for other, oq in quotas.items():
        if other == team:
            continue
        h = held.get(other, 0)
        free_to_borrow += lendable(oq, h) - borrowed(oq, h)
    free_to_borrow = max(free_to_borrow, 0)
    if q.borrowing_limit_gpus is not None:
        free_to_borrow = min(free_to_borrow, max(q.borrowing_limit_gpus, 0))
    return max(q.nominal_gpus, 0) + free_to_borrow


def room(team: str, quotas: Mapping[str, Quota], held: Mapping[str, int]) -> int | None:
    """GPUs `team` may still add, or None when unlimited."""
    c = cap(team, quotas, held)
    return None if c is None else max(c - held.get(team, 0), 0)


def over_borrowed(quotas: Mapping[str, Quota], held: Mapping[str, int]) -> dict[str, int]:
    """GPUs each borrower must give back so the cohort lends no more than it has.

    The excess is taken from the borrowers that borrow the most first (ties by name),
    so the team furthest over its nominal quota gives back first."""
    total_lendable = sum(lendable(q, held.get(t, 0)) for t, q in quotas.items())
    owed = {t: borrowed(q, held.get(t, 0)) for t, q in quotas.items()}
    excess = sum(owed.values()) - total_lendable
    out: dict[str, int] = {}
    for team in sorted((t for t, n in owed.items() if n > 0), key=lambda t: (-owed[t], t)):
        if excess <= 0:
            break
        give = min(owed[team], excess)
        out[team] = give
        excess -= give
    return out
