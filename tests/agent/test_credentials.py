"""In-process tests of what the agent does with its secrets and who its tasks run as:
the join token removed from the bootstrap file, the worker record (0600), the saved
worker token tried first on a restart, and the task-user decision."""

from __future__ import annotations

import json
import pwd
import stat
from pathlib import Path
from typing import Any

import pytest

from autoscaler.agent import credentials
from autoscaler.agent.errors import AgentError
from autoscaler.agent.gpus import discover
from autoscaler.agent.loop import Agent
from autoscaler.agent.server_api import ServerRefused
from autoscaler.agent.settings import AgentSettings, Timing, resolve
from autoscaler.agent.task_user import TaskUserError, decide, parse_range
from autoscaler.agent.wire import RegisterBody, Registered

BOOT = {"server_url": "http://cp:1", "pool": "p", "provider": "local", "join_token": "asj_secret",
        "labels": {"team": "vision"}, "instance_id": "i-1", "unknown_key": [1, 2]}  # fmt: skip


def _boot(tmp_path: Path, mode: int = 0o600) -> Path:
    path = tmp_path / "agent.json"
    path.write_text(json.dumps(BOOT))
    path.chmod(mode)
    return path


def test_dropping_the_join_token_keeps_everything_else_and_the_files_mode(tmp_path: Path) -> None:
    path = _boot(tmp_path, 0o640)
    before = path.stat()
    assert credentials.drop_join_token(path) is True
    after = json.loads(path.read_text())
    assert after == {k: v for k, v in BOOT.items() if k != "join_token"}
    st = path.stat()
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o640, before.st_uid, before.st_gid)
    assert st.st_ino != before.st_ino  # replaced by a rename, not rewritten in place
    assert credentials.drop_join_token(path) is False  # nothing left to drop
    assert [p.name for p in tmp_path.iterdir()] == ["agent.json"]  # no temp file left behind


def test_the_worker_record_is_private_and_bound_to_server_pool_and_instance(tmp_path: Path) -> None:
    state = tmp_path / "state"
    rec = credentials.WorkerState("http://cp:1", "p", "i-1", "w-1", "asw_token")
    path = credentials.save_worker(state, rec)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(state.stat().st_mode) == 0o700
    assert credentials.load_worker(state) == rec
    assert rec.matches("http://cp:1", "p", "i-1") and not rec.matches("http://cp:1", "p", "i-2")
    credentials.forget_worker(state)
    assert credentials.load_worker(state) is None


def test_settings_accept_a_saved_worker_instead_of_a_join_token(tmp_path: Path) -> None:
    boot = tmp_path / "agent.json"
    boot.write_text(json.dumps({k: v for k, v in BOOT.items() if k != "join_token"}))
    env = {"AUTOSCALER_STATE_DIR": str(tmp_path / "state")}
    with pytest.raises(AgentError, match="no join token"):
        resolve({}, env, boot, Timing())
    credentials.save_worker(tmp_path / "state", credentials.WorkerState("http://cp:1", "p", "i-1", "w", "asw_x"))
    s = resolve({}, env, boot, Timing())
    assert s.join_token is None and s.state_dir == tmp_path / "state" and s.bootstrap_path == boot


def test_task_user_settings_come_from_flags_env_and_file(tmp_path: Path) -> None:
    boot = tmp_path / "agent.json"
    boot.write_text(json.dumps({**BOOT, "run_as": "file-user", "run_as_range": "1000-1010", "allow_root_tasks": True}))
    s = resolve({}, {}, boot, Timing())
    assert (s.run_as, s.run_as_range, s.allow_root_tasks) == ("file-user", (1000, 1010), True)
    s = resolve({"run_as": "flag-user"}, {"AUTOSCALER_RUN_AS_RANGE": "2000-2001"}, boot, Timing())
    assert (s.run_as, s.run_as_range) == ("flag-user", (2000, 2001))
    with pytest.raises(AgentError, match="must look like"):
        resolve({}, {"AUTOSCALER_RUN_AS_RANGE": "lots"}, boot, Timing())
    assert any("/proc/PID/cmdline" in w for w in resolve({"join_token": "asj_x"}, {}, boot, Timing()).warnings)


@pytest.mark.parametrize("text", ["0-10", "10-5", "x", "1-70000"])
def test_bad_uid_ranges_are_refused(text: str) -> None:
    with pytest.raises(TaskUserError):
        parse_range(text)


def test_as_root_tasks_run_as_the_task_user_and_never_as_root_unless_allowed() -> None:
    nobody = pwd.getpwnam("nobody")
    users = decide("nobody", None, False, euid=0)
    assert users.refusal is None and users.base is not None
    assert (users.base.uid, users.base.switch) == (nobody.pw_uid, True)
    assert any("share uid" in n for n in users.notes)  # the shared-uid caveat is said
    refused = decide("root", None, False, euid=0)
    assert refused.refusal is not None and "allow_root_tasks" in refused.refusal
    with pytest.raises(TaskUserError, match="refusing to run tasks as root"):
        refused.allocate([])
    allowed = decide("0", None, True, euid=0)
    assert allowed.base is not None and allowed.base.uid == 0 and allowed.refusal is None
    assert "does not exist" in (decide("no-such-user-here", None, False, euid=0).refusal or "")
    assert decide("nobody", (0, 5), False, euid=0).refusal is not None  # a range holding root


def test_a_uid_range_gives_each_task_its_own_uid() -> None:
    users = decide("nobody", (64200, 64202), False, euid=0)
    a = users.allocate([])
    b = users.allocate([a.uid])
    c = users.allocate([a.uid, b.uid])
    assert len({a.uid, b.uid, c.uid}) == 3 and all(u.dedicated for u in (a, b, c))
    with pytest.raises(TaskUserError, match="widen the range"):
        users.allocate([a.uid, b.uid, c.uid])


def test_an_agent_that_is_not_root_says_tasks_share_its_user() -> None:
    users = decide("someone-else", (64200, 64202), False, euid=65534)
    assert users.base is not None and users.base.switch is False and users.base.uid == 65534
    text = " ".join(users.notes)
    assert "not root" in text and "run_as 'someone-else' ignored" in text and "run_as_range ignored" in text


class FakeApi:
    """Answers register calls from a script: token -> Registered or a refusal."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.calls: list[str] = []

    def register(self, token: str, body: RegisterBody) -> Registered:
        self.calls.append(token)
        answer = self.answers[token]
        if isinstance(answer, Exception):
            raise answer
        return Registered(worker_id=answer, worker_token=f"asw_{answer}", heartbeat_interval_s=1, heartbeat_timeout_s=5)


def _agent(tmp_path: Path, api: FakeApi, join: str | None) -> Agent:
    boot = tmp_path / "agent.json"
    boot.write_text(json.dumps({**BOOT, "join_token": join}))
    settings = AgentSettings(server_url="http://cp:1", pool="p", provider="local", join_token=join,
                             join_token_ref=None, instance_id="i-1", state_dir=tmp_path / "state",
                             bootstrap_path=boot, work_dir=tmp_path / "work")  # fmt: skip
    return Agent(settings, api, discover(None), None)  # type: ignore[arg-type]


def test_first_join_saves_the_worker_token_and_drops_the_join_token(tmp_path: Path) -> None:
    api = FakeApi({"asj_secret": "w-1"})
    reg = _agent(tmp_path, api, "asj_secret")._register()
    assert reg is not None and reg.worker_id == "w-1"
    assert "join_token" not in json.loads((tmp_path / "agent.json").read_text())
    saved = credentials.load_worker(tmp_path / "state")
    assert saved is not None and saved.worker_token == "asw_w-1"


def test_a_restart_comes_back_with_the_worker_token(tmp_path: Path) -> None:
    credentials.save_worker(tmp_path / "state", credentials.WorkerState("http://cp:1", "p", "i-1", "w-1", "asw_w-1"))
    api = FakeApi({"asw_w-1": "w-1"})
    reg = _agent(tmp_path, api, None)._register()
    assert reg is not None and reg.worker_id == "w-1" and api.calls == ["asw_w-1"]


def test_a_refused_worker_token_without_a_join_token_is_a_clear_error(tmp_path: Path) -> None:
    credentials.save_worker(tmp_path / "state", credentials.WorkerState("http://cp:1", "p", "i-1", "w-1", "asw_w-1"))
    api = FakeApi({"asw_w-1": ServerRefused(401, "invalid token")})
    with pytest.raises(AgentError, match="join token was used up"):
        _agent(tmp_path, api, None)._register()
    assert credentials.load_worker(tmp_path / "state") is None  # not tried again


def test_a_record_of_another_instance_is_not_used(tmp_path: Path) -> None:
    credentials.save_worker(tmp_path / "state", credentials.WorkerState("http://cp:1", "p", "i-9", "w-9", "asw_w-9"))
    api = FakeApi({"asj_secret": "w-1"})
    assert _agent(tmp_path, api, "asj_secret")._register() is not None
    assert api.calls == ["asj_secret"]
