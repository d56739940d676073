"""`autoscaler agent`: the process on each GPU machine (see docs/agent.md).

Imports stay light on purpose: the agent must start on a VM image without pulling
in the server (SQLAlchemy, FastAPI), so `autoscaler.agent` is imported lazily.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from autoscaler.cli import app


@app.command()
def agent(
    bootstrap: Annotated[
        Path | None,
        typer.Option(
            help="Bootstrap JSON written by cloud-init (env AUTOSCALER_BOOTSTRAP; "
            "default /etc/autoscaler/agent.json when it exists)."
        ),
    ] = None,
    server: Annotated[str | None, typer.Option("--server", help="Control plane URL (env AUTOSCALER_SERVER).")] = None,
    pool: Annotated[str | None, typer.Option(help="Pool this machine belongs to (env AUTOSCALER_POOL).")] = None,
    join_token: Annotated[
        str | None,
        typer.Option(help="One-time join token (env AUTOSCALER_JOIN_TOKEN; prefer the env or file)."),
    ] = None,
    instance_id: Annotated[
        str | None, typer.Option(help="Instance id; default: the cloud metadata service, else the hostname.")
    ] = None,
    provider: Annotated[str | None, typer.Option(help="aws, gcp, azure, local, slurm or static.")] = None,
    metadata_url: Annotated[
        str | None, typer.Option(help="Base URL of the cloud metadata service (default 169.254.169.254).")
    ] = None,
    work_dir: Annotated[Path | None, typer.Option(help="Where tasks without a working dir get scratch dirs.")] = None,
    run_as: Annotated[
        str | None,
        typer.Option(help="User tasks run as when the agent is root (env AUTOSCALER_RUN_AS; default autoscaler-task)."),
    ] = None,
    run_as_range: Annotated[
        str | None,
        typer.Option(help="Uids A-B: a uid of its own for each running task (env AUTOSCALER_RUN_AS_RANGE)."),
    ] = None,
    allow_root_tasks: Annotated[
        bool,
        typer.Option("--allow-root-tasks", help="Allow run_as root (env AUTOSCALER_ALLOW_ROOT_TASKS=1)."),
    ] = False,
    state_dir: Annotated[
        Path | None,
        typer.Option(help="Where the worker token is kept, 0600 (env AUTOSCALER_STATE_DIR; systemd's StateDirectory)."),
    ] = None,
    max_tasks: Annotated[
        int | None, typer.Option(min=1, max=64, help="Tasks at once; default: one per GPU, 1 without.")
    ] = None,
    heartbeat_interval: Annotated[
        float | None,
        typer.Option(min=0.01, help="Seconds between heartbeats; default: what the server says."),
    ] = None,
    lease_interval: Annotated[float, typer.Option(min=0.01, help="Seconds between lease attempts.")] = 2.0,
    lease_wait: Annotated[
        float,
        typer.Option(
            min=0,
            max=60,
            help="While idle, let a lease wait in the server up to this long for work (long-poll); 0: poll.",
        ),
    ] = 20.0,
    drain_deadline: Annotated[float, typer.Option(min=0, help="On SIGTERM: seconds tasks may still run.")] = 90.0,
    kill_grace: Annotated[float, typer.Option(min=0, help="SIGTERM to SIGKILL on cancel/timeout/drain.")] = 10.0,
    preempt_grace: Annotated[
        float, typer.Option(min=0, help="SIGTERM to SIGKILL on a spot notice that gives no deadline.")
    ] = 25.0,
    preempt_margin: Annotated[
        float | None,
        typer.Option(
            min=0,
            help="On a spot notice, SIGKILL this long before its deadline (default: aws 10, gcp 5, azure 5).",
        ),
    ] = None,
    notice_interval: Annotated[float, typer.Option(min=0.01, help="Seconds between preemption checks.")] = 5.0,
    log_flush: Annotated[float, typer.Option(min=0.01, help="Seconds between task output uploads.")] = 1.0,
    request_timeout: Annotated[float, typer.Option(min=0.1, help="Seconds per call to the server.")] = 10.0,
    backoff_max: Annotated[float, typer.Option(min=0.1, help="Longest wait between retries.")] = 30.0,
    register_timeout: Annotated[float, typer.Option(min=0, help="Give up registering after this long.")] = 600.0,
    image_pull_timeout: Annotated[
        float, typer.Option(min=1, help="Seconds a container task's image pull may take before the attempt fails.")
    ] = 900.0,
    probe: Annotated[
        bool,
        typer.Option("--probe", help="Print the GPU inventory and one metrics sample as JSON, then exit."),
    ] = False,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
) -> None:
    """Run the agent: register, lease and run tasks, drain on SIGTERM or a spot notice."""
    from autoscaler.agent import probe_json, run
    from autoscaler.agent.settings import Timing, read_bootstrap, resolve

    if probe:
        path = bootstrap or (
            Path(os.environ["AUTOSCALER_BOOTSTRAP"]) if os.environ.get("AUTOSCALER_BOOTSTRAP") else None
        )
        simulated = read_bootstrap(path)[0].simulated_gpus if path else None
        typer.echo(probe_json(simulated))
        return
    timing = Timing(
        heartbeat_s=heartbeat_interval,
        lease_s=lease_interval,
        lease_wait_s=lease_wait,
        drain_deadline_s=drain_deadline,
        kill_grace_s=kill_grace,
        preempt_grace_s=preempt_grace,
        preempt_margin_s=preempt_margin,
        notice_poll_s=notice_interval,
        log_flush_s=log_flush,
        request_timeout_s=request_timeout,
        backoff_max_s=backoff_max,
        register_timeout_s=register_timeout,
        image_pull_timeout_s=image_pull_timeout,
    )
    flags = {
        "server_url": server,
        "pool": pool,
        "join_token": join_token,
        "instance_id": instance_id,
        "provider": provider,
        "metadata_url": metadata_url,
        "run_as": run_as,
        "run_as_range": run_as_range,
        "allow_root_tasks": allow_root_tasks or None,
        "state_dir": str(state_dir) if state_dir else None,
    }
    settings = resolve(flags, os.environ, bootstrap, timing, work_dir=work_dir)
    raise typer.Exit(run(settings, max_tasks=max_tasks, log_level=log_level))
