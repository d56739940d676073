"""The xdist groups: every entry names tests that exist, and a group's tests all run on
one worker under `-n 2 --dist loadgroup` (a real pytest run of a throwaway suite)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from tests.conftest import REPO
from tests.xdist_groups import GROUPS, group_of


def test_every_group_entry_names_an_existing_file_or_test() -> None:
    for prefix in GROUPS:
        path, _, name = prefix.partition("::")
        target = REPO / "tests" / path
        assert target.exists(), f"{prefix}: no {target.relative_to(REPO)}"
        if name:
            assert re.search(rf"^def {re.escape(name)}", target.read_text(), re.M), f"{prefix}: no such test"


def test_group_of_matches_by_node_id_prefix() -> None:
    assert group_of("tests/deploy/test_terraform.py::test_x[a@b]") == "deploy"
    assert group_of("tests/agent/test_carry.py::test_unprivileged_tasks_own_their_unpacked_code_and_x") == "task-uids"
    assert group_of("tests/agent/test_carry.py::test_git_code_at_a_ref_with_the_uncommitted_diff") is None
    assert group_of("tests/deployment_test.py::test_x") is None


SUITE_CONFTEST = """
from tests.xdist_groups import GroupScheduling

class Scheduling(GroupScheduling):
    groups = {"grouped/": "g", "loose/test_loose.py::test_joins": "g"}

def pytest_xdist_make_scheduler(config, log):
    return Scheduling(config, log)
"""
SLEEPY = "import time\n\n" + "".join(f"def test_{n}():\n    time.sleep(0.2)\n\n" for n in ("a", "b", "c", "d"))


def test_a_groups_tests_run_on_one_worker_and_the_others_beside_it(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(SUITE_CONFTEST)
    for d in ("grouped", "loose"):
        (tmp_path / d).mkdir()
    (tmp_path / "grouped" / "test_one.py").write_text(SLEEPY)
    (tmp_path / "grouped" / "test_two.py").write_text(SLEEPY)
    (tmp_path / "loose" / "test_loose.py").write_text(SLEEPY + "def test_joins():\n    pass\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = ["-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    ran = re.findall(r"^\[(gw\d)\] \[\s*\d+%\] PASSED (\S+)", done.stdout, re.M)
    assert len(ran) == 13, done.stdout
    workers: dict[str, set[str]] = defaultdict(set)
    for worker, nodeid in ran:
        grouped = nodeid.startswith("grouped/") or nodeid.endswith("::test_joins")
        workers["g" if grouped else nodeid].add(worker)
    assert len(workers["g"]) == 1, done.stdout
    (group_worker,) = workers["g"]
    assert any(w != {group_worker} for k, w in workers.items() if k != "g"), done.stdout  # ran beside the group
