"""`autoscaler simulate`: replay a trace through the real loop and compare with the
lower bound and the baselines (report.json, report.md, PNG plots)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from autoscaler.cli import app
from autoscaler.cli.common import finite, out
from autoscaler.errors import InvalidInput


class WarmPoolRule(StrEnum):
    adaptive = "adaptive"
    fixed = "fixed"


class StandbyScope(StrEnum):
    shared = "shared"
    team = "team"


@app.command()
def simulate(
    workload: Annotated[str, typer.Option("--workload", help="KIND:PATH; KIND is philly, alibaba or synthetic.")],
    config: Annotated[
        Path | None,
        typer.Option("--config", help="Autoscaler YAML (default: one AWS V100 pool priced from the shared catalog)."),
    ] = None,
    policy: Annotated[
        Path | None, typer.Option("--policy", help="Policy directory (default: the shipped policies).")
    ] = None,
    days: Annotated[
        float | None, typer.Option("--days", callback=finite, help="Keep the tasks arriving in the first D days.")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed for boot delays and spot reclaims.")] = 0,
    out_dir: Annotated[Path, typer.Option("--out", help="Directory for report.json, report.md and PNGs.")] = Path(
        "sim-out"
    ),
    preemption_rate: Annotated[
        float | None,
        typer.Option(
            "--preemption-rate",
            callback=finite,
            min=0,
            help="Spot reclaims per instance-hour in every zone. Default: the default world's per-zone rates, or 0.24 with --config.",
        ),
    ] = None,
    checkpoint_every: Annotated[
        float | None,
        typer.Option(
            "--checkpoint-every",
            callback=finite,
            min=0,
            help="Minutes between the tasks' own checkpoints; 0: they checkpoint only when told to stop (spot notice, drain). Default: a stopped task restarts from zero.",
        ),
    ] = None,
    checkpoints_share: Annotated[
        float,
        typer.Option(
            "--checkpoints-share",
            callback=finite,
            help="What-if: this share (0-1) of tasks, drawn from the seed, checkpoints on the spot notice and says so at enqueue.",
        ),
    ] = 0.0,
    expected_runtime_known: Annotated[
        bool,
        typer.Option(
            "--expected-runtime-known",
            help="What-if: every task declares its true run time at enqueue (default: estimated from history).",
        ),
    ] = False,
    wait_target: Annotated[
        float | None,
        typer.Option(
            "--wait-target",
            callback=finite,
            min=0.1,
            help="What-if: minutes of accumulated wait a task may spend; spot that would pass it gives way to on-demand. Default: the config's wait target (off; docs/capacity.md).",
        ),
    ] = None,
    standby: Annotated[
        bool | None,
        typer.Option(
            "--standby/--no-standby",
            help="What-if, with a wait target: keep booted spot machines standing by for checkpointing tasks on spot (the default), or not, so such tasks keep the target on on-demand. Default: the config's capacity.standby (on).",
        ),
    ] = None,
    standby_scope: Annotated[
        StandbyScope | None,
        typer.Option(
            "--standby-scope",
            help="What-if, with standby: shared stands machines by for every team with the same placement (launched for no team); team gives each team its own. Default: the config's capacity.standby_scope (shared).",
        ),
    ] = None,
    idle_timeout: Annotated[
        float | None,
        typer.Option(
            "--idle-timeout",
            callback=finite,
            min=1,
            help="What-if: the longest an idle machine is kept warm for the next task, in seconds, in every pool (the config's idle_timeout_s; default 300).",
        ),
    ] = None,
    warm_pool: Annotated[
        WarmPoolRule | None,
        typer.Option(
            "--warm-pool",
            help="What-if: adaptive keeps only the idle machines recent task starts would use before a fresh one boots; fixed keeps every idle machine for the idle timeout. Default: the config's warm_pool (adaptive).",
        ),
    ] = None,
) -> None:
    """Replay a GPU cluster trace through the real planner, policy and reconciler."""
    from autoscaler.config import load_config
    from autoscaler.sim import report as sim_report
    from autoscaler.sim.catalog import DEFAULT_ZONE_RATES, default_config
    from autoscaler.sim.engine import SimSettings
    from autoscaler.sim.runner import run_simulation
    from autoscaler.sim.workload import load_workload

    try:  # before the run, which can take minutes: a report with nowhere to go is lost
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidInput(
            f"--out {out_dir}: cannot create it ({exc.strerror}); give a directory you can write"
        ) from None
    if policy is not None and not (policy / "data").is_dir():
        raise InvalidInput(f"--policy {policy}: not a policy directory (expected *.rego files and data/)")
    wl = load_workload(workload, seed=seed).first_days(days)
    if not wl.tasks:
        raise InvalidInput(f"--workload {workload}: no tasks to simulate (check --days)")
    cfg = load_config(config) if config else default_config(wl.teams)
    if wait_target is not None:
        capacity = cfg.capacity.model_copy(update={"wait_target_s": wait_target * 60.0})
        cfg = cfg.model_copy(update={"capacity": capacity})
    if standby is not None:
        cfg = cfg.model_copy(update={"capacity": cfg.capacity.model_copy(update={"standby": standby})})
    if standby_scope is not None:
        capacity = cfg.capacity.model_copy(update={"standby_scope": standby_scope.value})
        cfg = cfg.model_copy(update={"capacity": capacity})
    if idle_timeout is not None:
        pools = [p.model_copy(update={"idle_timeout_s": idle_timeout}) for p in cfg.pools]
        cfg = cfg.model_copy(update={"pools": pools})
    if warm_pool is not None:
        pools = [p.model_copy(update={"warm_pool": warm_pool.value}) for p in cfg.pools]
        cfg = cfg.model_copy(update={"pools": pools})
    from autoscaler.sim.baselines import too_wide

    if wide := too_wide(wl, cfg):
        raise InvalidInput(
            f"{wide} task(s) need more GPUs than any instance type in the config offers; "
            "add a wider instance type or split those tasks"
        )
    checkpoint_s = None if checkpoint_every is None else checkpoint_every * 60.0
    if not 0.0 <= checkpoints_share <= 1.0:
        raise InvalidInput(
            f"--checkpoints-share {checkpoints_share:g}: expected a share of tasks between 0 and 1 (e.g. 0.3)"
        )
    # One rate given applies to every zone; without one the default world keeps its
    # per-zone rates (a --config has none, so its zones get the middle value, 0.24).
    by_zone = DEFAULT_ZONE_RATES if config is None and preemption_rate is None else {}
    settings = SimSettings(
        seed=seed,
        preemption_per_hour=0.24 if preemption_rate is None else preemption_rate,
        preemption_by_zone=by_zone,
        checkpoint_every_s=checkpoint_s,
        checkpoints_share=checkpoints_share,
        expected_runtime_known=expected_runtime_known,
    )
    with Progress(
        TextColumn("[bold]simulating[/bold] {task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        transient=True,
    ) as bar:
        job = bar.add_task(escape(wl.name), total=1.0)  # a file name is not markup

        def advance(done_s: float, expected_s: float) -> None:
            bar.update(job, completed=min(done_s / expected_s, 1.0) if expected_s else 1.0)

        outcome = run_simulation(wl, cfg, policy_dir=policy, settings=settings, progress=advance)
    report = sim_report.build(outcome, policy)
    files = sim_report.write(outcome, report, out_dir)
    out.print(sim_report.markdown(report))
    out.print("wrote " + ", ".join(str(f) for f in files))
