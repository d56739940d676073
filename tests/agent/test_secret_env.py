"""A real agent process runs a task with secret env: the task's process has the value
(it prints only its SHA-256), the agent's log at DEBUG and the task's uploaded output
never hold it, and the server shows it as `***`."""

from __future__ import annotations

import hashlib
import json

from tests.agent.conftest import BOTH_BACKENDS, AgentHarness, py

SECRET = "wandb-Zq8r3VtLk2mN9pX4sW7y"


@BOTH_BACKENDS
def test_the_task_process_gets_the_secret_and_nothing_else_shows_it(harness: AgentHarness) -> None:
    code = (
        "import hashlib, json, os\n"
        "print(json.dumps({'sha256': hashlib.sha256(os.environ['WANDB_API_KEY'].encode()).hexdigest(),\n"
        "                  'epochs': os.environ['EPOCHS']}))\n"
    )
    task_id = harness.enqueue(py(code), env={"EPOCHS": "3"}, secret_env={"WANDB_API_KEY": SECRET})
    agent = harness.start_agent(instance_id="i-secret", extra=["--log-level", "debug"])
    done = harness.wait_state(task_id, "succeeded", "failed")
    assert done["state"] == "succeeded", harness.logs(task_id)
    out = json.loads(harness.logs(task_id, "stdout").strip().splitlines()[-1])
    assert out == {"sha256": hashlib.sha256(SECRET.encode()).hexdigest(), "epochs": "3"}
    assert done["secret_env"] == {"WANDB_API_KEY": "***"} and done["env"] == {"EPOCHS": "3"}
    assert " DEBUG " in agent.log()  # the agent did log at DEBUG
    assert SECRET not in agent.log()
    assert SECRET not in harness.logs(task_id)
