"""`enqueue --checkpoints/--expected-runtime`, `task show` and `task why` on the
capacity choice, through a real server process."""

from __future__ import annotations

import json
from pathlib import Path

from tests.test_cli import cli, server  # noqa: F401  (the module-scoped server fixture)


def test_declared_then_shown_then_explained(server: dict[str, str]) -> None:  # noqa: F811
    env = {**server, "AUTOSCALER_TOKEN": Path(server["AUTOSCALER_HOME"], "admin.token").read_text().strip()}
    r = cli(
        "enqueue", "-q", "gpu", "--gpus", "1", "--checkpoints", "every:30", "--expected-runtime", "2h",
        "--", "python", "train.py", env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    task_id = r.stdout.strip()
    shown = cli("task", "show", task_id, env=env)
    assert shown.returncode == 0, shown.stderr
    assert "checkpoints: every:30  run time: 2.0 h (declared)" in shown.stdout
    why = cli("task", "why", task_id, env=env)
    assert why.returncode == 0, why.stderr
    assert "capacity: spot: expected spot" in why.stdout
    long = cli("enqueue", "-q", "gpu", "--gpus", "1", "--expected-runtime", "30h", "--", "sleep", "1", env=env)
    answer = json.loads(cli("task", "why", long.stdout.strip(), "--json", env=env).stdout)
    assert answer["capacity"]["capacity_type"] == "on_demand"
    plain = cli("enqueue", "-q", "gpu", "--gpus", "1", "--", "python", "eval.py", env=env).stdout.strip()
    text = cli("task", "show", plain, env=env).stdout
    assert "checkpoints: none (a reclaim restarts it from zero)" in text and "the prior: no earlier run" in text


def test_a_bad_declaration_is_one_line_that_says_what_is_accepted(server: dict[str, str]) -> None:  # noqa: F811
    env = {**server, "AUTOSCALER_TOKEN": Path(server["AUTOSCALER_HOME"], "admin.token").read_text().strip()}
    r = cli("enqueue", "-q", "gpu", "--checkpoints", "sometimes", "--", "x", env=env)
    assert r.returncode != 0 and "none, on-signal or every:MIN" in r.stderr and "Traceback" not in r.stderr
    r = cli("enqueue", "-q", "gpu", "--expected-runtime", "soon", "--", "x", env=env)
    assert r.returncode != 0 and "duration 'soon' not understood" in r.stderr and "Traceback" not in r.stderr
