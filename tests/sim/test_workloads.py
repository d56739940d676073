"""Loaders on committed excerpts (see fixtures/ATTRIBUTION.md) and the one-line errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from autoscaler.errors import InvalidInput
from autoscaler.sim.synthetic import generate
from autoscaler.sim.workload import load_workload

FIX = Path(__file__).parent / "fixtures"


def test_philly_excerpt() -> None:
    wl = load_workload(f"philly:{FIX / 'philly'}")
    assert wl.teams == ("0e4a51", "103959")
    assert len(wl.tasks) == 40  # 40 lines: one task each, a wide job is one gang
    first = wl.tasks[0]
    assert first.arrival_s == 0.0 and first.gpus == 1
    # Run time = steps / throughput: the first 0e4a51 line has 95121 steps.
    import json

    table = json.loads((FIX / "philly" / "simulation_throughputs.json").read_text())["v100"]
    rate = table["('Transformer (batch size 128)', 1)"]["null"]
    t = next(t for t in wl.tasks if t.key == "0e4a51-1")
    assert t.duration_s == pytest.approx(95121 / rate)
    assert all(t.gpus <= 8 for t in wl.tasks)
    # A job wider than a machine is ONE task of ceil(gpus / 8) ranks with all its GPUs.
    for t in wl.tasks:
        assert t.nodes == 1 or (t.gpus == 8 and t.nodes >= 2)


def test_alibaba_excerpt() -> None:
    wl = load_workload(f"alibaba:{FIX / 'alibaba_pods.csv'}")
    pod0 = next(t for t in wl.tasks if t.key == "openb-pod-0000")
    assert (pod0.team, pod0.arrival_s, pod0.duration_s, pod0.gpus) == ("ls", 0.0, 12537496.0, 1)
    assert wl.first_days(1).tasks == tuple(t for t in wl.tasks if t.arrival_s < 86400)


def test_synthetic_is_seeded() -> None:
    assert generate(3, tasks=20) == generate(3, tasks=20)
    assert generate(3, tasks=20) != generate(4, tasks=20)


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("philly:/no/such/dir", "/no/such/dir does not exist; philly expects a directory"),
        ("alibaba:/no/such.csv", "/no/such.csv does not exist; alibaba expects"),
        ("bogus:x", "expected KIND:PATH with KIND one of philly, alibaba, synthetic"),
        ("synthetic:abc", "expected synthetic:SEED"),
    ],
)
def test_bad_spec_is_one_clear_error(spec: str, needle: str) -> None:
    with pytest.raises(InvalidInput) as err:
        load_workload(spec)
    assert needle in err.value.message


def test_cli_prints_one_line_for_a_missing_trace(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "autoscaler", "simulate", "--workload", "philly:/no/such/dir", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "/no/such/dir does not exist" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_writes_the_report(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "autoscaler",
            "simulate",
            "--workload",
            "synthetic:2:6",
            "--out",
            str(tmp_path),
            "--checkpoint-every",
            "30",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    import json

    rep = json.loads((tmp_path / "report.json").read_text())
    for key in ("total_cost_usd", "lower_bound_usd", "waits_s", "teams"):
        assert key in rep
    assert set(rep["baselines"]) == {"clearml_style", "managed_spot", "static_fleet"}
    assert set(rep["baselines"]["clearml_style"]) >= {"total_cost_usd", "waits_s", "teams", "gpu_hours"}
    assert rep["total_cost_usd"] >= rep["lower_bound_usd"] > 0
    for png in ("fleet_and_queue.png", "spend_vs_budget.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| ours |" in (tmp_path / "report.md").read_text()
    assert rep["settings"]["checkpoint_every_s"] == 1800.0
    assert rep["usd_per_completed_gpu_hour"] > 0


def test_gang_note_counts_the_slice_not_the_whole_trace() -> None:
    """Issue 23 item 11: a note about wide jobs counted the whole trace for a one-day
    slice; the count is the slice's own jobs."""
    from autoscaler.sim.workload import Workload, gang_note, gang_of

    tasks = [
        gang_of("a", "t", 10.0, 60.0, 16),  # day 0: one job, one gang of two ranks
        gang_of("b", "t", 20.0, 60.0, 4),
        gang_of("c", "t", 2 * 86400.0, 60.0, 24),  # day 2
        gang_of("d", "t", 3 * 86400.0, 60.0, 9),
    ]
    whole = Workload("w", tuple(tasks), ("teams note", gang_note(tasks, "pod") or ""), job_unit="pod")
    assert whole.notes[1] == "3 pod(s) wider than one machine run as gangs of 2-3 machines (all ranks start together)"
    day = whole.first_days(1)
    assert len(day.tasks) == 2
    assert day.notes == (
        "teams note",
        "1 pod(s) wider than one machine run as gangs of 2 machines (all ranks start together)",
    )
    assert whole.first_days(0.0001).notes == ("teams note",)  # no gang in the slice: no note


def test_a_wide_job_is_one_gang_with_all_its_gpus() -> None:
    from autoscaler.sim.workload import gang_of

    assert gang_of("a", "t", 0.0, 60.0, 8) == gang_of("a", "t", 0.0, 60.0, 8, machine_gpus=8)
    assert (gang_of("a", "t", 0.0, 60.0, 8).nodes, gang_of("a", "t", 0.0, 60.0, 8).gpus) == (1, 8)
    g = gang_of("a", "t", 0.0, 60.0, 32)
    assert (g.nodes, g.gpus, g.total_gpus, g.work_gpu_s) == (4, 8, 32, 32 * 60.0)
    # 12 on 8-GPU machines: two ranks of 6 (equal shares), not 8 + 4.
    assert (gang_of("a", "t", 0.0, 60.0, 12).nodes, gang_of("a", "t", 0.0, 60.0, 12).gpus) == (2, 6)
    # An uneven width rounds up to whole equal ranks: 9 -> 2 x 5.
    assert gang_of("a", "t", 0.0, 60.0, 9).total_gpus == 10
    # The machine the job would run on decides the rank size.
    assert (
        gang_of("a", "t", 0.0, 60.0, 16, machine_gpus=4).nodes,
        gang_of("a", "t", 0.0, 60.0, 16, machine_gpus=4).gpus,
    ) == (4, 4)


def _simulate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "autoscaler", "simulate", "--workload", "synthetic:2:6", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_an_out_dir_that_cannot_be_made_is_said_before_the_run(tmp_path: Path) -> None:
    # It used to be a traceback after the whole run, its report lost.
    (tmp_path / "a-file").write_text("")
    proc = _simulate("--out", str(tmp_path / "a-file" / "out"))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert (
        proc.stderr.strip()
        == f"error: --out {tmp_path / 'a-file' / 'out'}: cannot create it (Not a directory); give a directory you can write"
    )


@pytest.mark.parametrize(
    "option,value",
    # inf: --preemption-rate hung the run, --wait-target crashed it (OverflowError); nan --days said "no tasks".
    [("--preemption-rate", "inf"), ("--wait-target", "inf"), ("--days", "nan"), ("--checkpoint-every", "inf")],
)
def test_non_finite_numbers_are_refused_before_the_run(tmp_path: Path, option: str, value: str) -> None:
    proc = _simulate("--out", str(tmp_path), option, value)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"Invalid value for '{option}'" in proc.stderr and f"{value} is not a finite number" in proc.stderr
