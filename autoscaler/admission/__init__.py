"""Admission: the one rule that decides whether work may start, used by every gate.

The policy's per-team answer (`policy.schema.TeamDecision`) is turned into a
`TeamAdmission` after each evaluation (`model.py`) and kept in the `team_admission`
table (`store.py`), where the lease transaction reads it cheaply. The planner (what
to launch) and `queueing.tasks.lease` (what a worker may run) both ask the same pure
functions here: `fit.py` (does a task fit a machine), `quota.py` (how many GPUs a team
may hold, Kueue-style) and `gate.py` (may this team add this work on this machine).
"""
