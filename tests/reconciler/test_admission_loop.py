"""Admission through the real reconcile loop: the decision reaches the lease gate
(team_admission), and a failed policy holds (nothing launched, not even for a pool
minimum; the metric says so)."""

from __future__ import annotations

from pathlib import Path

from autoscaler.config import AutoscalerConfig, parse_config
from autoscaler.metrics.collector import snapshot_families
from autoscaler.policy.schema import Decision, EvaluationResult, PolicyInput
from autoscaler.reconciler.cycle import Reconciler
from autoscaler.state.db import transaction
from autoscaler.state.models import Instance, TeamAdmissionRow
from tests.conftest import TEST_CONFIG
from tests.reconciler.harness import make_rig


class BrokenPolicy:
    revision = "broken"

    def evaluate(self, policy_input: PolicyInput) -> EvaluationResult:
        return EvaluationResult(
            decision=Decision.failed("engine crashed"),
            revision="broken",
            input_digest="",
            eval_ms=0.0,
            error="engine crashed",
        )

    def close(self) -> None:
        pass


def _config_with_min(n: int) -> AutoscalerConfig:
    return parse_config(
        TEST_CONFIG.replace("max_instances: 4", f"max_instances: 4\n    min_instances: {n}"), Path("test.yaml")
    )


def test_failed_policy_launches_nothing_even_for_pool_minimums(sqlite_sessions, clock) -> None:
    rig = make_rig(sqlite_sessions, _config_with_min(2), clock, BrokenPolicy())
    rig.enqueue(team="vision")
    rec: Reconciler = rig.reconciler()
    result = rec.run_cycle()
    assert result.launched == [] and rig.instances() == []
    assert any("nothing is launched" in n for n in result.plan.notes)
    with sqlite_sessions() as s:
        rows = {r.team: r for r in s.query(TeamAdmissionRow)}
        assert rows[""].fail_safe and not rows[""].may_scale_up
        families = {f.name: f for f in snapshot_families(s, now=clock.now(), spend=[], team=None)}
    assert families["autoscaler_policy_fail_safe"].samples[0].value == 1.0


def test_shipped_policy_decision_reaches_the_lease_gate(sqlite_sessions, clock, shipped_policy, config) -> None:
    rig = make_rig(sqlite_sessions, config, clock, shipped_policy)
    rig.enqueue(team="vision", gpus=1)
    rig.reconciler().run_cycle()
    with transaction(sqlite_sessions) as s:
        rows = {r.team: r for r in s.query(TeamAdmissionRow)}
        assert "vision" in rows and "" in rows
        launched = s.query(Instance).all()
    # The launch for vision used its headroom or none was set; the row is there either way.
    assert launched and all(i.team == "vision" for i in launched)


def test_a_pool_minimum_machine_serves_whichever_team_holds_it(sqlite_sessions, clock, shipped_policy) -> None:
    """A machine launched for no team (the pool's min_instances) in a `tenancy: team`
    pool belongs to the team whose work holds it, one team at a time, and to any team
    once free. Before, its instance record's launch team ("shared") was taken for its
    tenant, so no team could ever lease it."""
    rig = make_rig(sqlite_sessions, _config_with_min(1), clock, shipped_policy)
    rig.reconciler().run_cycle()
    (inst,) = rig.instances()
    assert inst.team == "shared"
    wid = rig.register(rig.instance(inst.id))
    first = rig.enqueue(team="vision")
    assert rig.lease(wid) == first
    rig.finish(wid, first)
    second = rig.enqueue(team="nlp")
    assert rig.lease(wid) == second
    # The planner sees it the same way: nlp's next task waits for a machine of its own
    # or this one, and vision's queued task gets a launch (the machine is nlp's now).
    rig.enqueue(team="vision")
    result = rig.reconciler().run_cycle()
    assert [launch.team for launch in result.plan.launches] == ["vision"]
