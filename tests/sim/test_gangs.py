"""Gangs in the simulator: a trace job wider than a machine is one task of N ranks,
leased through the real queueing code (reserve, start together, whole-gang recovery,
reservation timeout), and the report counts its waits and the GPU-hours its
reservations held apart from single tasks'."""

from __future__ import annotations

import math
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from autoscaler.queueing.gangs import DEFAULT_RESERVATION_TIMEOUT_S
from autoscaler.sim import report
from autoscaler.sim.engine import SIM_START, SimOutcome
from autoscaler.sim.workload import TraceTask, Workload
from autoscaler.state.models import Task, TaskRank
from tests.sim.helpers import one_pool, run, settings


def _ranks(out: SimOutcome, key: str) -> tuple[Task, list[TaskRank]]:
    task_id = next(i for i, t in out.tasks.items() if t.trace.key == key)
    with out.sessions() as s:
        task = s.get(Task, task_id)
        assert task is not None
        ranks = list(s.scalars(select(TaskRank).where(TaskRank.task_id == task_id).order_by(TaskRank.id)))
        s.expunge_all()
    return task, ranks


def _wide() -> Workload:
    # A 2 x 1-GPU gang on 1-GPU machines, and a single task just after it.
    return Workload("g", (TraceTask("gang", "t", 0.0, 3600.0, 1, nodes=2), TraceTask("one", "t", 10.0, 600.0, 1)))


def test_a_gang_is_one_task_whose_ranks_start_together(tmp_path: Path) -> None:
    out = run(_wide(), one_pool(("t",), gpus=1), tmp_path, settings())
    task, ranks = _ranks(out, "gang")
    assert (task.nodes, task.gpus, task.state, task.attempts) == (2, 1, "succeeded", 1)
    assert [(r.rank, r.state, r.end_reason) for r in ranks] == [(0, "exited", "exit 0"), (1, "exited", "exit 0")]
    assert len({r.worker_id for r in ranks}) == 2  # one rank per machine
    assert ranks[0].started_at == ranks[1].started_at and ranks[0].ended_at == ranks[1].ended_at
    track = out.tasks[task.id]
    # Both machines booted in 120 s; the gang ran an hour on both: 2 GPU-hours of work.
    assert track.wait_s == pytest.approx(120.0)
    assert track.ran_gpu_s == pytest.approx(2 * 3600.0)
    rep = report.build(out, None)
    assert rep["lower_bound_work_gpu_hours"] == pytest.approx(2.0 + 600 / 3600, abs=0.05)
    assert rep["gangs"]["tasks"] == 1 and rep["gangs"]["succeeded"] == 1
    assert rep["gangs"]["waits_s"]["p50"] == pytest.approx(120.0)
    # Both ranks were reserved and started in the same instant (the boots coincide).
    assert rep["gangs"]["reservation_gpu_hours"] == pytest.approx(0.0)


def test_a_reclaimed_rank_requeues_the_whole_gang_as_one(tmp_path: Path) -> None:
    # The first spot machine (rank 0's) is reclaimed 30 min after launch, 2 min notice.
    out = run(_wide(), one_pool(("t",), gpus=1), tmp_path, settings(reclaim_first_spot_after_s=1800.0))
    task, ranks = _ranks(out, "gang")
    assert task.state == "succeeded" and task.interruptions == 1 and task.failures == 0  # max_attempts not spent
    first = [r for r in ranks if r.attempt == 1]
    second = [r for r in ranks if r.attempt == 2]
    # Attempt 1: the reclaimed rank was interrupted, the other told to stop at once.
    assert sorted(r.end_reason or "" for r in first) == ["canceled", "interrupted"]
    assert first[0].ended_at == first[1].ended_at
    # Attempt 2: all ranks again, started together; nothing of attempt 1 ran on.
    assert len(second) == 2 and second[0].started_at == second[1].started_at
    assert all(r.started_at is not None and r.started_at >= first[0].ended_at for r in second)  # type: ignore[operator]
    track = out.tasks[task.id]
    # 26 min ran on each rank before the notice and was lost on both (no checkpoint).
    assert track.lost_gpu_s == pytest.approx(2 * 1560.0)
    assert track.ran_gpu_s == pytest.approx(2 * 1560.0 + 2 * 3600.0)
    rep = report.build(out, None)
    # Rank 0 of attempt 2 was reserved on the surviving machine at the notice and held
    # until the replacement booted (120 s): one GPU for 2 min.
    assert rep["gangs"]["reservation_gpu_hours"] == pytest.approx(120.0 / 3600.0, abs=1e-3)


def test_a_gang_that_cannot_complete_releases_its_reservation_and_blocks_nobody(tmp_path: Path) -> None:
    # Three ranks, but the pool may have two machines: the gang can never start.
    cfg = one_pool(("t",), gpus=1)
    cfg = cfg.model_copy(update={"pools": [cfg.pools[0].model_copy(update={"max_instances": 2})]})
    wl = Workload(
        "g",
        (
            TraceTask("gang", "t", 0.0, 600.0, 1, nodes=3),
            TraceTask("one", "t", 60.0, 600.0, 1),
            TraceTask("two", "t", 1500.0, 600.0, 1),
        ),
    )
    out = run(wl, cfg, tmp_path, settings(horizon_after_last_arrival_s=1800.0))
    by_key = {t.trace.key: t for t in out.tasks.values()}
    assert by_key["one"].state == "succeeded" and by_key["two"].state == "succeeded"  # no deadlock
    task, ranks = _ranks(out, "gang")
    assert task.state == "queued" and by_key["gang"].started_s is None
    assert ranks, "the gang never reserved a rank"
    assert all(r.started_at is None for r in ranks)  # never a partially started gang
    for r in ranks:
        if r.state == "released":
            assert r.end_reason == "reservation timeout"
            assert r.ended_at is not None
            held = (r.ended_at - r.reserved_at).total_seconds()
            # Released by the first lease past the timeout (an agent asks every 0.25 s).
            assert held <= DEFAULT_RESERVATION_TIMEOUT_S + 1.0
    rep = report.build(out, None)
    assert rep["gangs"]["tasks"] == 1 and rep["gangs"]["succeeded"] == 0
    # The held GPU-hours are the ranks' reserved spans, no more: what a timeout bounds.
    end = SIM_START + timedelta(seconds=out.end_s)
    spans = sum(len(r.gpu_indices) * ((r.ended_at or end) - r.reserved_at).total_seconds() for r in ranks)
    assert rep["gangs"]["reservation_gpu_hours"] == pytest.approx(spans / 3600.0, abs=0.01)
    assert rep["gangs"]["reservation_gpu_hours"] > 0


def test_baselines_price_a_gang_as_one_job_on_all_its_machines() -> None:
    from autoscaler.sim import baselines, bounds, managed_spot

    wl = Workload("g", (TraceTask("gang", "t", 0.0, 3600.0, 1, nodes=2),))
    cfg = one_pool(("t",), spot=1.0, on_demand=2.0, gpus=1)
    st = settings()
    # Two GPU-hours at the spot price of a machine that fits one rank.
    assert baselines.lower_bound(wl, cfg) == pytest.approx(2.0)
    assert baselines.too_wide(wl, cfg) == 0  # one rank fits a 1-GPU machine
    # Static fleet: enough machines for the gang, both ranks at once, no wait.
    fleet = baselines.static_fleet(wl, cfg)
    assert fleet["fleet"]["instances"] == 2 and fleet["waits_s"]["p50"] == 0.0
    assert fleet["gpu_hours"]["used"] == pytest.approx(2.0)
    # ClearML-style: the poll launches a worker per rank; the gang starts when both
    # have booted (120 s), never on one alone.
    cm = baselines.clearml_style(wl, cfg, st)
    assert cm["counts"]["launches"] == 2 and cm["tasks"]["succeeded"] == 1
    assert cm["waits_s"]["p50"] == pytest.approx(120.0) and cm["gpu_hours"]["used"] == pytest.approx(2.0)
    # Managed spot: one job on two spot machines, started on the later boot.
    ms = managed_spot.managed_spot(wl, cfg, st)
    assert ms["counts"]["launches"] == 2 and ms["tasks"]["succeeded"] == 1
    assert ms["waits_s"]["p50"] == pytest.approx(120.0) and ms["gpu_hours"]["used"] == pytest.approx(2.0)
    # Reclaim-aware: either machine's reclaim restarts both, so the rate is 2 x 0.5 per
    # hour: 2 GPUs x (e^(1.0 x 1) - 1) / 1.0 = 3.44 USD, below on-demand's 4.00; one
    # 2-GPU machine at 0.5 would have cost 2 x (e^0.5 - 1) / 0.5 = 2.60.
    aware = bounds.reclaim_aware_bound(wl, cfg, settings(preemption_per_hour=0.5))
    assert aware["usd"] == pytest.approx(2 * math.expm1(1.0), abs=0.01)
    assert aware["tasks_by_choice"]["spot_restart"] == 1


def test_clearml_style_loses_a_gang_whole_when_one_machine_is_reclaimed() -> None:
    from autoscaler.sim import baselines

    wl = Workload("g", (TraceTask("gang", "t", 0.0, 3600.0, 1, nodes=2),))
    cfg = one_pool(("t",), spot=1.0, on_demand=2.0, gpus=1)
    # Reclaims are frequent enough that some machine of the gang goes before it ends.
    cm = baselines.clearml_style(wl, cfg, settings(preemption_per_hour=3.0, horizon_after_last_arrival_s=4 * 3600.0))
    assert cm["counts"]["preemptions"] >= 1 and cm["counts"]["lost_tasks_resubmitted"] >= 1
    # Every loss is resubmitted by hand 2 h later: the wait has at least one of those.
    assert cm["waits_s"]["p50"] >= baselines.CLEARML_RESUBMIT_S


def test_the_report_text_names_gang_waits_and_reservation_hours(tmp_path: Path) -> None:
    out = run(_wide(), one_pool(("t",), gpus=1), tmp_path, settings(reclaim_first_spot_after_s=1800.0))
    text = report.markdown(report.build(out, None))
    assert "Gangs (ours): 1/1 finished; wait p50 " in text
    assert "reservations held 0.0 GPU-h before their ranks started (0 rank reservation(s)" in text
    # A workload without gangs has no such line.
    single = Workload("s", (TraceTask("one", "t", 0.0, 600.0, 1),))
    (tmp_path / "single").mkdir()
    alone = run(single, one_pool(("t",)), tmp_path / "single", settings())
    assert "Gangs (ours)" not in report.markdown(report.build(alone, None))
