"""Burst agents into an existing Slurm cluster: one batch job = one instance.

- `launch` writes the agent's bootstrap file (from the launch's cloud-init user-data,
  the same bytes a VM gets) and submits `sbatch` with `--gres=gpu:N`, a job name that is
  the instance id, a `--comment` carrying the owner tag, pool and request id, `--output`
  to the log dir and `--chdir`. The job script runs the real agent and forwards SIGTERM
  to it, so `scancel` means "drain now" (Slurm sends SIGKILL only after `KillWait`).
- Idempotent by request id: the instance id (job name) derives from the request id and
  a record file is written after submission; a retry finds the record (or the queued
  job by name, if we crashed between `sbatch` and the record) and submits nothing.
- `list` is one `squeue` of our user's jobs, filtered by the owner in the comment. A job
  still pending (waiting in Slurm's queue) past the boot timeout is cancelled there.
- A gang (`request.nodes` = N > 1, or any request with a `gang` id) is ONE job:
  `sbatch --nodes=N --ntasks-per-node=1 --gres=gpu:G` whose batch script starts one
  `srun` step of N tasks, one agent per node, each with its own bootstrap file and
  instance id (`<job name>-r<rank>`); Slurm starts all N or none. `list` surfaces the
  job as N instances, and terminating any of them cancels the whole job (a gang is
  never left half running). A gang wider than the partition (`sinfo`) is refused
  with `InvalidRequest` before anything is submitted; `max_gang_nodes` tells the
  planner the limit beforehand.
- Without slurmdbd, finished jobs vanish from `squeue` after `MinJobAge`: a job Slurm
  no longer knows is finished.
"""

from __future__ import annotations

import builtins
import contextlib
import getpass
import hashlib
import json
import os
import re
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from providers.base import (
    TAG_GANG,
    TAG_OWNER,
    TAG_POOL,
    TAG_REQUEST,
    Capabilities,
    CapacityError,
    InstanceStatus,
    InvalidRequest,
    LaunchRequest,
    Offering,
    ProviderError,
    ProviderInstance,
    QuotaError,
    Scope,
    TransientError,
)
from providers.bootstrap import BootstrapError, parse_user_data
from providers.slurm.settings import SlurmSettings

TAG_INSTANCE = "autoscaler-instance"
TAG_NODES = "autoscaler-nodes"
_RANK = re.compile(r"(.+)-r(\d+)")
_SQUEUE_FORMAT = "%i|%j|%T|%V|%N|%k"
_STATUS = {
    "PENDING": InstanceStatus.PENDING,
    "CONFIGURING": InstanceStatus.PENDING,
    "REQUEUED": InstanceStatus.PENDING,
    "REQUEUE_HOLD": InstanceStatus.PENDING,
    "REQUEUE_FED": InstanceStatus.PENDING,
    "RESIZING": InstanceStatus.PENDING,
    "RUNNING": InstanceStatus.RUNNING,
    "COMPLETING": InstanceStatus.STOPPING,
    "SIGNALING": InstanceStatus.STOPPING,
    "STAGE_OUT": InstanceStatus.STOPPING,
    "STOPPED": InstanceStatus.STOPPING,
    "SUSPENDED": InstanceStatus.STOPPING,
    "PREEMPTED": InstanceStatus.PREEMPTED,
}
# sbatch's refusals, by what they block (message fragments as Slurm 22.05 prints them).
_ERRORS: list[tuple[re.Pattern[str], type[ProviderError], Scope]] = [
    (
        re.compile(r"node configuration is not available|gres.*not available|More processors requested", re.I),
        CapacityError,
        Scope.OFFERING,
    ),
    (
        re.compile(r"MaxSubmit|AssocMax|QOSMax|accounting/QOS policy|job limit", re.I),
        QuotaError,
        Scope.PROVIDER,
    ),
    (
        re.compile(r"Unable to contact slurm controller|Socket timed out|temporarily unavailable|try again", re.I),
        TransientError,
        Scope.PROVIDER,
    ),
    (
        re.compile(r"Invalid (partition|account|qos)|not permitted|access denied", re.I),
        InvalidRequest,
        Scope.PROVIDER,
    ),
]

JOB_SCRIPT = """#!/bin/bash
# Submitted by the GPU autoscaler: pool {pool}, request {request_id}, instance {instance_id}.
# One agent per job. scancel sends SIGTERM: forward it to the agent, which drains
# (finishes or hands back its task) and exits; Slurm sends SIGKILL after KillWait.
agent_pid=""
trap '[ -n "$agent_pid" ] && kill -TERM "$agent_pid" 2>/dev/null' TERM INT
{command} &
agent_pid=$!
# `wait` returns early when a trapped signal arrives: keep waiting for the drain.
while kill -0 "$agent_pid" 2>/dev/null; do wait "$agent_pid"; done
wait "$agent_pid"
"""

# A gang: the batch script runs one srun step of N tasks (one per node) and forwards
# SIGTERM to it; srun passes it to every task. --kill-on-bad-exit: one rank's agent
# dying ends the step, so a gang is never left half running.
GANG_SCRIPT = """#!/bin/bash
# Submitted by the GPU autoscaler: pool {pool}, request {request_id}, gang {gang}, {nodes} node(s).
step_pid=""
trap '[ -n "$step_pid" ] && kill -TERM "$step_pid" 2>/dev/null' TERM INT
srun --nodes={nodes} --ntasks={nodes} --ntasks-per-node=1 --kill-on-bad-exit=1 {gres}bash {rank_script} &
step_pid=$!
while kill -0 "$step_pid" 2>/dev/null; do wait "$step_pid"; done
wait "$step_pid"
"""

# One task of the step: rank $SLURM_PROCID runs its agent with its own bootstrap file.
RANK_SCRIPT = """#!/bin/bash
rank="${{SLURM_PROCID:?not in a Slurm step}}"
agent_pid=""
trap '[ -n "$agent_pid" ] && kill -TERM "$agent_pid" 2>/dev/null' TERM INT
{command} --bootstrap "{state_dir}/{job_name}-r${{rank}}.agent.json" &
agent_pid=$!
while kill -0 "$agent_pid" 2>/dev/null; do wait "$agent_pid"; done
wait "$agent_pid"
"""


@dataclass(frozen=True)
class JobRecord:
    """What `<state_dir>/<instance_id>.json` holds about one submitted job."""

    instance_id: str
    job_id: str
    request_id: str
    pool: str
    owner: str
    instance_type: str
    submitted_at: str
    # A gang job: its node count and gang id (records written before gangs have neither).
    nodes: int = 1
    gang: str | None = None


@dataclass(frozen=True)
class QueuedJob:
    job_id: str
    name: str
    state: str
    submitted: str
    nodes: str
    comment: dict[str, str]


class SlurmProvider:
    """A pool backed by an existing Slurm cluster; see the module docstring."""

    name = "slurm"

    def __init__(self, settings: SlurmSettings, offerings: Sequence[Offering]) -> None:
        self.settings = settings
        self.capabilities = Capabilities(max_gang_nodes=settings.max_gang_nodes)
        self._offerings = list(offerings)
        self._user = getpass.getuser()
        self._env = {**os.environ}
        if settings.slurm_conf:
            self._env["SLURM_CONF"] = settings.slurm_conf

    # ---- the Provider protocol -----------------------------------------------------

    def offerings(self) -> builtins.list[Offering]:
        return builtins.list(self._offerings)

    def launch(self, request: LaunchRequest) -> builtins.list[ProviderInstance]:
        try:
            bootstrap = parse_user_data(request.user_data)
        except BootstrapError as exc:
            raise InvalidRequest(f"Slurm launch {request.request_id}: {exc}", code="InvalidBootstrap") from None
        if request.nodes < 1:
            raise InvalidRequest(f"a launch needs at least one node, got nodes={request.nodes}")
        for d in (self.settings.state_dir, self.settings.log_dir, self.settings.work_dir):
            d.mkdir(parents=True, exist_ok=True)
        gang = request.nodes > 1 or request.gang is not None
        # Index 0: the job name keeps the form it had when a request could ask for
        # several jobs, so jobs submitted before still match their request.
        instance_id = self.instance_id(request.request_id, 0)
        record = self._read_record(instance_id)
        if record is None:
            job = {j.name: j for j in self._squeue()}.get(instance_id)
            if job is not None:
                job_id = job.job_id
            elif gang:
                self._check_gang_fits(request)
                job_id = self._submit_gang(request, instance_id, bootstrap)
            else:
                job_id = self._submit(request, instance_id, bootstrap)
            record = self._write_record(request, instance_id, job_id)
        if record.gang is not None or record.nodes > 1:
            return self._rank_views(record, InstanceStatus.PENDING)
        return [self._record_view(record, InstanceStatus.PENDING)]

    def list(self, owner: str) -> builtins.list[ProviderInstance]:
        out: builtins.list[ProviderInstance] = []
        now = datetime.now(UTC)
        for job in self._squeue():
            if job.comment.get(TAG_OWNER) != owner:
                continue
            status = _STATUS.get(job.state.split()[0])
            if status is None:
                continue  # finished (COMPLETED, CANCELLED, FAILED, TIMEOUT, ...)
            record = self._read_record(job.name)
            submitted = _parse_time(record.submitted_at) if record else _parse_local(job.submitted)
            if (
                status == InstanceStatus.PENDING
                and submitted is not None
                and (now - submitted).total_seconds() > self.settings.boot_timeout_s
            ):
                # Never started within the boot timeout: free the queue slot and let the
                # reconciler plan this demand elsewhere (another pool, a cloud).
                self._scancel([job.job_id])
                continue
            view = ProviderInstance(
                instance_id=job.name,
                request_id=job.comment.get(TAG_REQUEST),
                pool=job.comment.get(TAG_POOL),
                instance_type=record.instance_type if record else "",
                capacity_type="on_demand",
                zone=job.nodes or None,
                status=status,
                launched_at=submitted,
                tags={**job.comment, "slurm-job-id": job.job_id},
            )
            nodes = job.comment.get(TAG_NODES)
            if nodes is None:
                out.append(view)
            else:
                # A gang job is N instances, one per rank, all on the job's node list.
                out.extend(replace(view, instance_id=f"{job.name}-r{r}") for r in range(int(nodes)))
        return out

    def terminate(self, instance_ids: Sequence[str]) -> None:
        if not instance_ids:
            return
        job_ids: builtins.list[str] = []
        by_name = {j.name: j.job_id for j in self._squeue()}
        for instance_id in instance_ids:
            if instance_id in by_name:
                job_ids.append(by_name[instance_id])
            elif (m := _RANK.fullmatch(instance_id)) and m.group(1) in by_name:
                # One rank of a gang: the whole job goes (never a half gang).
                job_ids.append(by_name[m.group(1)])
        job_ids = builtins.list(dict.fromkeys(job_ids))
        # scancel answers 0 for a job that is gone: already gone = success.
        if job_ids:
            self._scancel(job_ids)

    # ---- helpers -------------------------------------------------------------------

    def instance_id(self, request_id: str, index: int) -> str:
        slug = re.sub(r"[^a-zA-Z0-9]+", "-", request_id).strip("-")[:24].strip("-")
        digest = hashlib.sha256(request_id.encode()).hexdigest()[:8]
        return "-".join(p for p in (self.settings.name_prefix, slug, digest, str(index)) if p)

    def _submit(self, request: LaunchRequest, instance_id: str, bootstrap: dict[str, Any]) -> str:
        s = self.settings
        agent_file = s.state_dir / f"{instance_id}.agent.json"
        # The bootstrap carries a one-time join token: readable by the job's user only.
        fd = os.open(agent_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({**bootstrap, "instance_id": instance_id}, f, indent=2, sort_keys=True)
        command = shlex.join([*s.agent_command, "--bootstrap", str(agent_file)])
        script = s.state_dir / f"{instance_id}.sbatch"
        script.write_text(
            JOB_SCRIPT.format(
                pool=request.pool, request_id=request.request_id, instance_id=instance_id, command=command
            )
        )
        argv = self._sbatch_argv(request, instance_id, nodes=1, extra_comment={})
        argv.append(str(script))
        return self._sbatch(argv)

    def _sbatch_argv(
        self, request: LaunchRequest, job_name: str, *, nodes: int, extra_comment: dict[str, str]
    ) -> builtins.list[str]:
        s = self.settings
        offering = request.offering
        comment = ";".join(
            f"{k}={v}"
            for k, v in {
                TAG_OWNER: request.owner,
                TAG_POOL: request.pool,
                TAG_REQUEST: request.request_id,
                TAG_INSTANCE: job_name,
                **extra_comment,
            }.items()
        )
        argv = [
            "sbatch",
            "--parsable",
            f"--job-name={job_name}",
            f"--comment={comment}",
            f"--output={s.log_dir / job_name}-%j.log",
            f"--chdir={s.work_dir}",
            f"--nodes={nodes}",
            f"--ntasks={nodes}",
        ]
        if nodes > 1:
            argv.append("--ntasks-per-node=1")
        # Per node: --gres and --mem are per node in Slurm, --cpus-per-task per rank.
        if offering.gpus:
            argv.append(f"--gres=gpu:{offering.gpus}")
        if offering.cpus:
            argv.append(f"--cpus-per-task={offering.cpus}")
        if offering.memory_mb:
            argv.append(f"--mem={offering.memory_mb}M")
        for flag, value in (
            ("partition", s.partition),
            ("account", s.account),
            ("qos", s.qos),
            ("time", s.time_limit),
        ):
            if value:
                argv.append(f"--{flag}={value}")
        argv += list(s.extra_sbatch_args)
        return argv

    def _sbatch(self, argv: builtins.list[str]) -> str:
        out = self._run(argv, what="sbatch")
        job_id = out.strip().split(";")[0]
        if not job_id.isdigit():
            raise TransientError(f"sbatch printed no job id: {out.strip()[:200]!r}", code="NoJobId")
        return job_id

    def _check_gang_fits(self, request: LaunchRequest) -> None:
        """Refuse a gang wider than the partition: Slurm would queue it forever or refuse
        it as a capacity problem, and neither says what is wrong."""
        s = self.settings
        if s.max_gang_nodes is not None and request.nodes > s.max_gang_nodes:
            raise InvalidRequest(
                f"Slurm pool {request.pool!r} takes gangs of at most {s.max_gang_nodes} node(s) "
                f"(options.max_gang_nodes); this gang needs {request.nodes}",
                code="GangTooWide",
            )
        out = self._run(["sinfo", "--noheader", "--format=%P|%D"], what="sinfo")
        total = 0
        name = s.partition
        for line in out.splitlines():
            part, _, count = line.strip().partition("|")
            is_default = part.endswith("*")
            if (name is None and is_default) or part.rstrip("*") == name:
                with contextlib.suppress(ValueError):
                    total += int(count)
        if request.nodes > total:
            where = f"partition {name!r}" if name else "the default partition"
            raise InvalidRequest(
                f"Slurm pool {request.pool!r}: {where} has {total} node(s), a gang of {request.nodes} "
                f"nodes x {request.offering.gpus} GPU(s) cannot run there; use a wider partition "
                "(options.partition) or a cloud pool for this gang",
                code="GangTooWide",
            )

    def _submit_gang(self, request: LaunchRequest, job_name: str, bootstrap: dict[str, Any]) -> str:
        """One sbatch for the whole gang (see the module docstring)."""
        s = self.settings
        n = request.nodes
        for rank in range(n):
            instance_id = f"{job_name}-r{rank}"
            agent_file = s.state_dir / f"{instance_id}.agent.json"
            fd = os.open(agent_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump({**bootstrap, "instance_id": instance_id}, f, indent=2, sort_keys=True)
        rank_script = s.state_dir / f"{job_name}.rank.sh"
        rank_script.write_text(
            RANK_SCRIPT.format(command=shlex.join(s.agent_command), state_dir=s.state_dir, job_name=job_name)
        )
        offering = request.offering
        gres = f"--gres=gpu:{offering.gpus} " if offering.gpus else ""
        script = s.state_dir / f"{job_name}.sbatch"
        script.write_text(
            GANG_SCRIPT.format(
                pool=request.pool,
                request_id=request.request_id,
                gang=request.gang or request.request_id,
                nodes=n,
                gres=gres,
                rank_script=shlex.quote(str(rank_script)),
            )
        )
        extra = {TAG_NODES: str(n), TAG_GANG: request.gang or request.request_id}
        argv = self._sbatch_argv(request, job_name, nodes=n, extra_comment=extra)
        argv.append(str(script))
        return self._sbatch(argv)

    def _squeue(self) -> builtins.list[QueuedJob]:
        out = self._run(["squeue", "--noheader", f"--user={self._user}", f"--format={_SQUEUE_FORMAT}"], what="squeue")
        jobs: builtins.list[QueuedJob] = []
        for line in out.splitlines():
            parts = line.split("|", 5)
            if len(parts) != 6:
                continue
            comment = dict(kv.split("=", 1) for kv in parts[5].split(";") if "=" in kv)
            jobs.append(QueuedJob(parts[0].strip(), parts[1], parts[2], parts[3], parts[4], comment))
        return jobs

    def _scancel(self, job_ids: Sequence[str]) -> None:
        self._run(["scancel", *job_ids], what="scancel")

    def _run(self, argv: builtins.list[str], *, what: str) -> str:
        try:
            done = subprocess.run(argv, env=self._env, capture_output=True, text=True, timeout=60)
        except FileNotFoundError:
            raise InvalidRequest(
                f"{argv[0]} not found: install the Slurm client commands (Debian: slurm-client) on the control plane",
                scope=Scope.PROVIDER,
                code="MissingSlurm",
            ) from None
        except subprocess.TimeoutExpired:
            raise TransientError(f"{what} did not answer within 60 s", code="Timeout") from None
        if done.returncode != 0:
            raise map_error(what, done.stderr.strip() or done.stdout.strip())
        return done.stdout

    def _record_path(self, instance_id: str) -> Path:
        return self.settings.state_dir / f"{instance_id}.json"

    def _read_record(self, instance_id: str) -> JobRecord | None:
        try:
            return JobRecord(**json.loads(self._record_path(instance_id).read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def _write_record(self, request: LaunchRequest, instance_id: str, job_id: str) -> JobRecord:
        record = JobRecord(
            instance_id=instance_id,
            job_id=job_id,
            request_id=request.request_id,
            pool=request.pool,
            owner=request.owner,
            instance_type=request.offering.instance_type,
            submitted_at=datetime.now(UTC).isoformat(),
            nodes=request.nodes,
            gang=request.gang if request.gang is not None else (request.request_id if request.nodes > 1 else None),
        )
        tmp = self._record_path(instance_id).with_suffix(".tmp")
        tmp.write_text(json.dumps(record.__dict__))
        tmp.replace(self._record_path(instance_id))
        return record

    def _rank_views(self, record: JobRecord, status: InstanceStatus) -> builtins.list[ProviderInstance]:
        one = self._record_view(record, status)
        tags = {**one.tags, TAG_GANG: record.gang or record.request_id, TAG_NODES: str(record.nodes)}
        return [replace(one, instance_id=f"{record.instance_id}-r{r}", tags=tags) for r in range(record.nodes)]

    def _record_view(self, record: JobRecord, status: InstanceStatus) -> ProviderInstance:
        return ProviderInstance(
            instance_id=record.instance_id,
            request_id=record.request_id,
            pool=record.pool,
            instance_type=record.instance_type,
            capacity_type="on_demand",
            zone=None,
            status=status,
            launched_at=_parse_time(record.submitted_at),
            tags={
                TAG_OWNER: record.owner,
                TAG_POOL: record.pool,
                TAG_REQUEST: record.request_id,
                "slurm-job-id": record.job_id,
            },
        )


def map_error(code: str, message: str, http_status: int | None = None) -> ProviderError:
    """A failed Slurm command (`code`: which one) and what it printed -> a typed error.

    The same shape as the cloud drivers' `map_error`; Slurm has no error codes or HTTP
    status, so its refusals are told apart by their words (`_ERRORS`)."""
    text = f"{code} failed: {message.splitlines()[-1] if message else 'no output'}"
    for pattern, kind, scope in _ERRORS:
        if pattern.search(message):
            if kind is TransientError:
                return TransientError(text, code="SlurmUnavailable")
            return kind(text, scope=scope, code="Slurm")
    return InvalidRequest(text, code="Slurm")


def _parse_time(value: str) -> datetime | None:
    with contextlib.suppress(ValueError):
        return datetime.fromisoformat(value)
    return None


def _parse_local(value: str) -> datetime | None:
    """squeue prints local time without a zone."""
    with contextlib.suppress(ValueError):
        return datetime.fromisoformat(value).astimezone(UTC)
    return None
