"""The Philly duration rule: a job's throughput comes from its own scale factor where the
table lists it, else from the largest listed scale factor below it scaled linearly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoscaler.sim.philly import load_philly, throughput

# A hand-written excerpt: ResNet-18 lists 1, 2, 4 and 8 GPUs; A3C only 1 GPU.
TABLE = {
    "v100": {
        "('ResNet-18 (batch size 64)', 1)": {"null": 24.0},
        "('ResNet-18 (batch size 64)', 2)": {"null": 74.0},
        "('ResNet-18 (batch size 64)', 4)": {"null": 95.0},
        "('ResNet-18 (batch size 64)', 8)": {"null": 256.0},
        "('A3C', 1)": {"null": 7.0},
        "('Broken', 1)": {"null": None},
    }
}


def _line(job_type: str, steps: int, arrival: float, gpus: int) -> str:
    return f"{job_type}\tpython3 main.py\t--num_steps\t1\t{steps}\t{arrival:f}\t{gpus}"


def _trace(tmp_path: Path, lines: list[str]) -> Path:
    (tmp_path / "vc").mkdir()
    (tmp_path / "vc" / "team.trace").write_text("\n".join(lines) + "\n")
    (tmp_path / "simulation_throughputs.json").write_text(json.dumps(TABLE))
    return tmp_path


def test_rule_on_the_table() -> None:
    rates = {1: 24.0, 2: 74.0, 4: 95.0, 8: 256.0}
    assert throughput(rates, 4) == 95.0  # listed: its own entry, not scaled
    assert throughput(rates, 16) == pytest.approx(512.0)  # 8-GPU entry x 2
    assert throughput(rates, 32) == pytest.approx(1024.0)  # 8-GPU entry x 4
    assert throughput(rates, 6) == pytest.approx(95.0 * 6 / 4)  # largest BELOW, not nearest
    assert throughput({1: 7.0}, 4) == pytest.approx(28.0)  # only 1 GPU listed
    assert throughput({2: 10.0}, 1) is None  # nothing at or below
    assert throughput({}, 8) is None


def test_loader_durations(tmp_path: Path) -> None:
    wl = load_philly(
        _trace(
            tmp_path,
            [
                _line("ResNet-18 (batch size 64)", 95_000, 0.0, 4),
                _line("ResNet-18 (batch size 64)", 512_000, 5.0, 16),
                _line("A3C", 7_000, 6.0, 2),
                _line("Broken", 100, 7.0, 1),
                _line("Unknown type", 100, 8.0, 1),
            ],
        )
    )
    by_job: dict[str, list[float]] = {}
    for t in wl.tasks:
        by_job.setdefault(t.key, []).append(t.duration_s)
    assert by_job["team-1"] == [pytest.approx(1000.0)]  # 95,000 / 95
    # 16 GPUs: 512,000 steps / (256 x 2) = 1,000 s, for the ONE gang of 2 x 8 GPUs.
    assert by_job["team-2"] == [pytest.approx(1000.0)]
    wide = next(t for t in wl.tasks if t.key == "team-2")
    assert (wide.nodes, wide.gpus) == (2, 8)
    assert by_job["team-3"] == [pytest.approx(500.0)]  # 7,000 / (7 x 2)
    # The old rule (1-GPU entry) would have given 512,000 / 24 s to the 16-GPU job.
    assert 512_000 / 24.0 not in by_job["team-2"]
    assert "team-4" not in by_job and "team-5" not in by_job
    assert any("2 job(s) without a throughput entry skipped" in n for n in wl.notes)
