"""The simulator's money is the ledger's: per-team figures come from the same code
path as the policy input and the dashboard, so a team running on a machine another
team's demand launched pays for the GPUs it holds, and a hard budget on one team does
not move cost onto another."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoscaler.ledger import by_month
from autoscaler.sim import metrics
from tests.sim.helpers import one_pool, policy_with_budgets, run, settings, tasks


def test_a_team_on_another_teams_machine_pays_for_its_gpus(tmp_path: Path) -> None:
    # One 8-GPU machine at 8 USD/h (1 USD per GPU-hour); ops' task launches it, lab's
    # tasks arrive while it runs and lease free GPUs on it. lab has a hard budget.
    yaml = "default: {monthly_usd: null, kind: soft}\nteams:\n  lab: {monthly_usd: 3000, kind: hard}\n"
    policy = policy_with_budgets(tmp_path, yaml)
    workload = tasks(
        ("ops", 0.0, 4 * 3600.0, 1),
        ("lab", 600.0, 3600.0, 2),
        ("lab", 900.0, 1800.0, 1),
    )
    # Teams share machines only in a `tenancy: shared` pool.
    pool = one_pool(("lab", "ops"), spot=8.0, on_demand=16.0, gpus=8, tenancy="shared")
    out = run(workload, pool, tmp_path, settings(), policy)
    report = metrics.ours(out, policy)
    teams = report["teams"]
    with out.sessions() as s:
        ledger = by_month(s)
    # The report's per-team figures are the ledger's, month by month.
    for team in ("lab", "ops"):
        assert teams[team]["spend_by_month_usd"] == {m: round(v, 2) for m, v in ledger.get(team, {}).items()}
        assert teams[team]["cost_usd"] == round(sum(ledger.get(team, {}).values()), 2)
    # Every dollar of the fleet is someone's, and each team pays at least for the GPUs it held.
    total = sum(sum(m.values()) for m in ledger.values())
    assert total == pytest.approx(report["total_cost_usd"], abs=0.01)
    lab_gpu_h = out.team_gpu_s.get("lab", 0.0) / 3600.0
    assert lab_gpu_h == pytest.approx(2.5)
    assert sum(ledger["lab"].values()) == pytest.approx(lab_gpu_h * 1.0, abs=0.01)
    # ops launched the machine: it pays its own GPU and the unused rest, not lab's share.
    assert sum(ledger["ops"].values()) == pytest.approx(total - lab_gpu_h, abs=0.01)
    # The hard budget is checked against what lab actually used.
    assert teams["lab"]["budget"]["within_hard_budget"]


# CPU-bound, no waits: lab's task never runs, so the run lasts the whole 60-day horizon
# (into the next months' budgets): 59-94 s alone at loads 6-10 on two cores, over 120 s
# (the suite's default limit) beside two other xdist workers.
@pytest.mark.timeout(360)
def test_a_team_held_by_its_hard_budget_gets_no_gpus_on_another_teams_machine(tmp_path: Path) -> None:
    # The same fleet, but lab's $3 hard budget cannot carry the month-end forecast of
    # 2 more GPUs: the lease gate keeps lab off ops' idle GPUs (it would add spend), so
    # lab pays nothing and holds nothing, and ops pays only for its own machine.
    yaml = "default: {monthly_usd: null, kind: soft}\nteams:\n  lab: {monthly_usd: 3, kind: hard}\n"
    policy = policy_with_budgets(tmp_path, yaml)
    workload = tasks(("ops", 0.0, 4 * 3600.0, 1), ("lab", 600.0, 3600.0, 2))
    pool = one_pool(("lab", "ops"), spot=8.0, on_demand=16.0, gpus=8, tenancy="shared")
    out = run(workload, pool, tmp_path, settings(), policy)
    with out.sessions() as s:
        ledger = by_month(s)
    assert out.team_gpu_s.get("lab", 0.0) == 0.0
    assert sum(ledger.get("lab", {}).values()) == pytest.approx(0.0, abs=0.01)
    assert metrics.ours(out, policy)["teams"]["lab"]["budget"]["within_hard_budget"]
