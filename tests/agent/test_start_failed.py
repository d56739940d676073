"""What a task that cannot start says: for a bare program name, where the task's PATH
has it, so 'Permission denied' for a pyenv under /root says where to look (the README's
first command ended so on a machine whose `python` was only root's)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autoscaler.agent.runner import StartFailed, _Launch
from autoscaler.agent.task_user import TaskUser

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="starting a task as another uid needs root")
NOBODY_UID = 64199  # no process runs as it; nothing is started under it


def _launch(path: str) -> _Launch:
    user = TaskUser(name="autoscaler-task", uid=NOBODY_UID, gid=NOBODY_UID, groups=(), home="/", switch=True)
    return _Launch(Path("/"), {"PATH": path}, NOBODY_UID, NOBODY_UID, [], user, "http://server")


def _refusal(launch: _Launch, argv: list[str]) -> str:
    with pytest.raises(StartFailed) as caught:
        launch.spawn(argv)
    return str(caught.value)


def test_a_program_only_where_the_task_user_cannot_reach_names_where_it_is(tmp_path: Path) -> None:
    hidden = tmp_path / "root-only"  # like /root/.pyenv/shims: the task user cannot enter
    hidden.mkdir(mode=0o700)
    prog = hidden / "myprog"
    prog.write_text("#!/bin/sh\necho hi\n")
    prog.chmod(0o755)
    said = _refusal(_launch(f"{hidden}:/usr/bin:/bin"), ["myprog", "--x"])
    assert said.startswith(f"cannot start 'myprog' as autoscaler-task (uid {NOBODY_UID}): Permission denied")
    assert f"on the task's PATH: {prog}" in said and "autoscaler-task must be able to reach and run one" in said


def test_a_program_on_no_path_entry_says_so_and_a_path_gets_no_hint() -> None:
    launch = _launch("/usr/bin:/bin")
    assert _refusal(launch, ["no-such-program-xyz"]).endswith("; no 'no-such-program-xyz' on the task's PATH")
    said = _refusal(launch, ["/nonexistent/prog"])
    assert said == f"cannot start '/nonexistent/prog' as autoscaler-task (uid {NOBODY_UID}): No such file or directory"
