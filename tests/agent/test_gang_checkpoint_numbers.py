"""How the agent numbers a gang rank's checkpoints and names its directory: the k-th
period since the attempt was handed over for a periodic one, one past the last period
for the one at the end (so the k-th of every rank is taken at about the same time,
docs/gangs.md "Checkpoints"); a rank's scratch dir is its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoscaler.agent import carry
from autoscaler.agent.runner import TaskProcess, _task_dir
from autoscaler.agent.wire import LeasedTask, Transfers


def _process(every: int | None) -> TaskProcess:
    task = LeasedTask(id="t1", command=["true"], checkpoint_dir="ckpt", checkpoint_every_s=every)
    return TaskProcess(task, None, 1000.0, None)


def test_periodic_checkpoints_are_numbered_by_period_and_the_last_one_past_them() -> None:
    tp = _process(10)
    periodic = [tp._generation(t, final=False) for t in (1010.2, 1020.9, 1031.0)]
    assert periodic == [1, 2, 3]
    # The end comes after the last period's upload, whenever in the period it falls.
    assert tp._generation(1031.5, final=True) == 4
    assert tp._generation(1039.99, final=True) == 4
    # A rank whose end came just before a period another rank's tick reached: the
    # same number as that tick, so the two are one generation.
    assert tp._generation(1009.5, final=True) == tp._generation(1010.1, final=False) == 1
    # A tick the poll reached late never repeats an earlier number.
    assert tp._generation(1019.99, final=False) == 1


def test_without_a_period_the_one_checkpoint_is_generation_one() -> None:
    assert _process(None)._generation(5000.0, final=True) == 1


def test_each_rank_of_a_gang_gets_its_own_scratch_dir(tmp_path: Path) -> None:
    def leased(env: dict[str, str]) -> LeasedTask:
        return LeasedTask(id="g1", command=["true"], attempts=2, env=env)

    _cwd, zero = _task_dir(leased({"AUTOSCALER_GANG_ID": "g1", "NODE_RANK": "0"}), tmp_path, None)
    _cwd, one = _task_dir(leased({"AUTOSCALER_GANG_ID": "g1", "NODE_RANK": "1"}), tmp_path, None)
    assert zero == tmp_path / "g1-2-rank0" and one == tmp_path / "g1-2-rank1"
    # A single task's env cannot steer its directory name.
    _cwd, single = _task_dir(leased({"NODE_RANK": "../x"}), tmp_path, None)
    assert single == tmp_path / "g1-2"
    _cwd, odd = _task_dir(leased({"AUTOSCALER_GANG_ID": "g1", "NODE_RANK": "../x"}), tmp_path, None)
    assert odd == tmp_path / "g1-2"


def test_a_gang_rank_stores_an_empty_checkpoint_dir_and_a_single_task_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """So a program that saves only from rank 0 still completes every generation."""
    sent: list[tuple[str, int]] = []

    def upload(base: str, url: str, src: Path, *, fmt: str = "file", generation: int = 0) -> tuple[int, str]:
        sent.append((url, generation))
        return 0, ""

    monkeypatch.setattr(carry, "upload", upload)
    (tmp_path / "ckpt").mkdir()
    transfers = Transfers(checkpoint_upload_url="/up")
    gang = LeasedTask(
        id="g1", command=["x"], checkpoint_dir="ckpt", transfers=transfers, env={"AUTOSCALER_GANG_ID": "g1"}
    )
    single = LeasedTask(id="s1", command=["x"], checkpoint_dir="ckpt", transfers=transfers)
    carry.save_checkpoint("http://s", single, tmp_path, lambda _line: None, generation=3)
    assert sent == []
    carry.save_checkpoint("http://s", gang, tmp_path, lambda _line: None, generation=3)
    assert sent == [("/up", 3)]
