"""Which tests share something of the whole machine, and the xdist scheduler that runs
each such group on one worker, one test at a time.

`make test` runs the suite in xdist workers (`-n 3 --dist loadgroup`). Each worker has
its own PostgreSQL server, Slurm cluster, cloud fakes and temp dirs (free ports,
mkdtemp), so most tests run beside each other; the tests in `GROUPS` cannot.

The grouping is done here, from node ids, and not with `xdist_group` marks: with
pytest 9.2, xdist 3.8's loadgroup ignores those marks without a word (it renames node
ids through an attribute pytest no longer reads; pytest-dev/pytest-xdist#1386).
"""

from __future__ import annotations

from xdist.scheduler import LoadGroupScheduling

# Node id prefixes under tests/ -> the group their tests run in.
GROUPS = {
    # Session fixtures too expensive to run once per worker (Terraform and checkov runs,
    # one Chromium); terraform also writes its .terraform dirs into the checkout.
    "deploy/": "deploy",
    "web/": "web",
    # Rootful podman: a test's clean-up removes every `autoscaler-*` container, and the
    # fake CDI specs in /var/run/cdi all define `nvidia.com/gpu`.
    "agent/test_container_tasks.py": "podman",
    "agent/test_container_carry.py": "podman",
    # Tasks under uids from 64100-64135: an agent hands out a uid no process runs as and
    # kills that uid's processes when its task ends, which would reach another agent's
    # task given the same uid (test_task_user.py also has a fixed /tmp work dir).
    "agent/test_task_user.py": "task-uids",
    "agent/test_carry.py::test_unprivileged_tasks_own_their_unpacked_code": "task-uids",
}


def group_of(nodeid: str, groups: dict[str, str] = GROUPS) -> str | None:
    """The group of a test, or None when it may run beside any other."""
    rel = nodeid.removeprefix("tests/")
    return next((group for prefix, group in groups.items() if rel.startswith(prefix)), None)


class GroupScheduling(LoadGroupScheduling):
    """xdist's loadgroup with the groups of `GROUPS`: each group is one work unit (xdist
    sends the larger units first), every other test a unit of its own."""

    groups = GROUPS

    def _split_scope(self, nodeid: str) -> str:
        group = group_of(nodeid, self.groups)
        return f"group:{group}" if group is not None else str(super()._split_scope(nodeid))
