"""CLI commands that talk to a running server: enqueue, tasks, logs, cancel, queues,
workers, instances, tokens."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import typer
from rich.text import Text

from autoscaler.cli import app
from autoscaler.cli.artifact_cmds import carry_fields
from autoscaler.cli.common import (
    HomeOpt,
    JsonOpt,
    ServerOpt,
    TokenOpt,
    client,
    out,
    print_json,
    print_table,
    sdk_client,
    shell_command,
)
from autoscaler.errors import InvalidInput
from autoscaler.sdk.body import task_body
from autoscaler.sdk.models import TaskInfo

task_app = typer.Typer(help="Inspect one task.", no_args_is_help=True)
token_app = typer.Typer(help="Create tokens (admin).", no_args_is_help=True)
app.add_typer(task_app, name="task")
app.add_typer(token_app, name="token")


DEFAULT_CODE_LIMIT = 512 * 1024 * 1024  # bytes of a packed --code directory


def _parse_env(pairs: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidInput(f"--env {pair!r} must look like KEY=VALUE")
        if not ENV_NAME.match(key):  # the server's pattern, said in words rather than as a regex
            raise InvalidInput(
                f"--env {pair!r}: {key!r} is not a variable name (letters, digits and _, not starting with a digit)"
            )
        env[key] = value
    return env


def _parse_codes(text: str | None) -> list[int] | None:
    if text is None:
        return None
    codes: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            codes.append(int(part))
        except ValueError:
            raise InvalidInput(f"--retry-on-exit-codes {text!r}: {part!r} is not a number; give e.g. 1,137") from None
    if not codes:
        raise InvalidInput("--retry-on-exit-codes is empty; give e.g. 1,137, or leave it out to retry every failure")
    return codes


def attempts_summary(task: dict[str, Any]) -> str:
    """What the counters mean, in one line: "failed attempts 1 of 3, interruptions 2"."""
    return (
        f"failed attempts {task.get('failures', 0)} of {task['max_attempts']}, "
        f"interruptions {task.get('interruptions', 0)}"
    )


ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def _parse_secret_env(pairs: list[str]) -> dict[str, str]:
    """`--secret-env NAME=VALUE`, or `--secret-env NAME` for the value of NAME in this
    shell's environment (which keeps it out of shell history and `ps`). Errors name the
    argument by position, never by what was typed: it may be the secret itself."""
    env: dict[str, str] = {}
    for number, pair in enumerate(pairs, 1):
        key, sep, value = pair.partition("=")
        if not ENV_NAME.match(key):
            raise InvalidInput(f"--secret-env #{number} must look like NAME=VALUE or NAME (a variable name)")
        if not sep:
            if key not in os.environ:
                raise InvalidInput(f"--secret-env {key}: no value given and {key} is not set in this environment")
            value = os.environ[key]
        env[key] = value
    return env


def read_secret_env_file(path: str) -> dict[str, str]:
    """A dotenv-style file (`-` reads standard input): one NAME=VALUE per line; blank
    lines and lines starting with `#` are skipped; an `export ` prefix is allowed; a
    value wrapped in matching single or double quotes loses them and keeps its inner
    spaces, otherwise it is stripped. Nothing is expanded or unescaped, and a value
    is one line. Errors name the line number, never the line (it may hold a secret)."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        raise InvalidInput(f"--secret-env-from-file {path}: cannot read it: {exc.strerror}") from None
    env: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        key, sep, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not ENV_NAME.match(key):
            raise InvalidInput(f"{path}:{number}: expected NAME=VALUE (NAME: letters, digits, _)")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[key] = value
    return env


@app.command(context_settings={"allow_interspersed_args": False})
def enqueue(
    command: Annotated[list[str], typer.Argument(help="The program and its arguments, after `--`.")],
    queue: Annotated[str, typer.Option("--queue", "-q", help="Queue name.")],
    gpus: Annotated[int, typer.Option(help="GPUs needed (per node).")] = 0,
    nodes: Annotated[
        int,
        typer.Option(help="Machines to run on at once, --gpus on each; all ranks start together (docs/gangs.md)."),
    ] = 1,
    gpu_type: Annotated[str | None, typer.Option(help="GPU model wanted, e.g. A100.")] = None,
    cpus: Annotated[float, typer.Option(help="CPUs needed.")] = 0,
    memory_mb: Annotated[int, typer.Option(help="Memory needed (MiB).")] = 0,
    priority: Annotated[int, typer.Option(help="Higher runs first within the queue.")] = 0,
    max_attempts: Annotated[
        int,
        typer.Option(
            help="Failed attempts (non-zero exit, timeout) before the task fails for good, the first included. "
            "Attempts ended by the machine (spot, drain, lost worker) never count.",
        ),
    ] = 3,
    retry_on_exit_codes: Annotated[
        str | None,
        typer.Option(
            help="Retry only these exit codes, e.g. 1,137 (128+N for a death by signal N); "
            "other exits and timeouts then fail at once. Default: retry every failure.",
        ),
    ] = None,
    timeout: Annotated[float | None, typer.Option(help="Seconds before the task is stopped.")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", "-e", help="KEY=VALUE, repeatable.")] = None,
    secret_env: Annotated[
        list[str] | None,
        typer.Option(
            "--secret-env",
            help="NAME=VALUE (or NAME: take the value from this shell), repeatable. Sealed at rest, shown as *** "
            "everywhere; only the worker running the task gets the value.",
        ),
    ] = None,
    secret_env_file: Annotated[
        str | None,
        typer.Option(
            "--secret-env-from-file",
            help="A dotenv-style file of NAME=VALUE lines (`-`: standard input), all secret. "
            "--secret-env entries win over the file's.",
        ),
    ] = None,
    workdir: Annotated[str | None, typer.Option(help="Absolute working directory on the worker.")] = None,
    image: Annotated[
        str | None,
        typer.Option(help="Run the command in this OCI image, with the task's GPUs only (see docs/agent.md)."),
    ] = None,
    image_pull_secret: Annotated[
        str | None,
        typer.Option(
            help="The --secret-env name holding the registry login for --image (USER:PASSWORD or an auth JSON).",
        ),
    ] = None,
    team: Annotated[str | None, typer.Option(help="Admins only: the team the task is for.")] = None,
    code: Annotated[
        str | None,
        typer.Option(
            help="A directory to run the task in: packed (honouring .gitignore) and uploaded; inside a git "
            "checkout, its origin, commit and uncommitted diff are sent instead (see --no-git)."
        ),
    ] = None,
    no_git: Annotated[
        bool, typer.Option("--no-git", help="With --code: pack the directory even in a checkout.")
    ] = False,
    code_limit: Annotated[
        int, typer.Option(min=1, help="Largest packed --code directory, in bytes.")
    ] = DEFAULT_CODE_LIMIT,
    git: Annotated[str | None, typer.Option(help="A repository the worker clones into the task's directory.")] = None,
    ref: Annotated[str | None, typer.Option(help="With --git: the commit, branch or tag to check out.")] = None,
    setup: Annotated[
        str | None, typer.Option(help="A shell command run first, e.g. 'pip install -r requirements.txt'.")
    ] = None,
    output: Annotated[
        list[str] | None,
        typer.Option("--output", help="A path in the task's directory saved when the attempt ends (repeatable)."),
    ] = None,
    checkpoint_dir: Annotated[
        str | None,
        typer.Option(help="A directory saved when the task is stopped and restored into its next attempt."),
    ] = None,
    checkpoint_every: Annotated[
        int | None, typer.Option(help="Also save the checkpoint dir every this many seconds.")
    ] = None,
    checkpoints: Annotated[
        str | None,
        typer.Option(
            help="What the task survives: none (a reclaim restarts it from zero), on-signal (it checkpoints on "
            "the reclaim notice; the default with --checkpoint-dir) or every:MIN. Weighs spot against on-demand."
        ),
    ] = None,
    expected_runtime: Annotated[
        str | None,
        typer.Option(help="How long it runs, e.g. 45m, 6h; default: estimated from earlier runs of the command."),
    ] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Enqueue a task: `autoscaler enqueue --queue gpu --gpus 1 -- python train.py`."""
    sdk = sdk_client(server, token, home)
    body = task_body(
        command,
        queue=queue,
        gpus=gpus,
        nodes=nodes,
        gpu_type=gpu_type,
        cpus=cpus,
        memory_mb=memory_mb,
        priority=priority,
        max_attempts=max_attempts,
        retry_on_exit_codes=_parse_codes(retry_on_exit_codes),
        timeout_s=timeout,
        env=_parse_env(env or []),
        secret_env={
            **(read_secret_env_file(secret_env_file) if secret_env_file else {}),
            **_parse_secret_env(secret_env or []),
        },
        working_dir=workdir,
        image=image,
        image_pull_secret=image_pull_secret,
        setup=setup,
        outputs=output or None,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every_s=checkpoint_every,
        checkpoints=checkpoints,
        expected_runtime_s=parse_duration(expected_runtime) if expected_runtime else None,
        team=team,
    )
    body.update(carry_fields(sdk, code=code, git=git, ref=ref, no_git=no_git, limit_bytes=code_limit, team=team))
    task = sdk.submit_raw(body)
    if json_out:
        print_json(task)
    else:
        typer.echo(task["id"])


@app.command()
def tasks(
    queue: Annotated[str | None, typer.Option(help="Only this queue.")] = None,
    state: Annotated[list[str] | None, typer.Option(help="Only these states (repeatable).")] = None,
    team: Annotated[str | None, typer.Option(help="Only this team (admins).")] = None,
    limit: int = 100,
    server: ServerOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """List tasks, newest first."""
    rows = client(server, token, home).get("/api/v1/tasks", queue=queue, state=state, team=team, limit=limit)
    if json_out:
        print_json(rows)
    else:
        for r in rows:
            r["command"] = _clip(shell_command(r["command"]), COMMAND_WIDTH)
            r["end_reason"] = end_text(r)
            r["failed"] = f"{r.get('failures', 0)}/{r['max_attempts']}"
            r["interrupted"] = r.get("interruptions", 0)
        print_table(rows, ["id", "queue", "team", "state", "gpus", "failed", "interrupted", "end_reason", "command"])


COMMAND_WIDTH = 80  # in the task list; `task show` prints the whole command


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _figure(value: Any) -> str:
    """A cost or a GPU-hour count as `task show` prints it: 4 decimals (a float as
    JSON carries it would print as 1.6014999999999998e-05)."""
    return f"{float(value or 0.0):,.4f}"


def runtime_line(task: dict[str, Any]) -> str:
    """What the task survives and how long it is expected to run, as the planner sees it."""
    checkpoints = task.get("checkpoints") or "none (a reclaim restarts it from zero)"
    est = task.get("runtime_estimate")
    if not est:
        return f"checkpoints: {checkpoints}  run time: not estimated (enqueued before estimates)"
    mean, lo, hi = (float(est.get(k) or 0.0) for k in ("mean_h", "p10_h", "p90_h"))
    if est.get("source") == "declared":
        runtime = f"{_hours(mean)} (declared)"
    else:
        basis = f"from {est.get('runs', 0)} earlier run(s)" if est.get("runs") else "the prior: no earlier run"
        runtime = f"~{_hours(mean)} expected (p10-p90 {_hours(lo)}-{_hours(hi)}, {basis} of this command)"
    return f"checkpoints: {checkpoints}  run time: {runtime}"


def _hours(h: float) -> str:
    return f"{h * 60:.0f} min" if h < 1 else f"{h:.1f} h"


def end_text(task: dict[str, Any]) -> str | None:
    """How the task ended, in the words of the history: `exit 0`, `exit 3`, `timeout`..."""
    reason: str | None = task.get("end_reason")
    if reason == "exit_code" and task.get("exit_code") is not None:
        return f"exit {task['exit_code']}"
    return reason


@task_app.command("show")
def task_show(
    task_id: str,
    server: ServerOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Show a task and its history."""
    sdk = sdk_client(server, token, home)
    task = sdk.task(task_id).info().raw
    gpu = sdk.api.get(f"/api/v1/tasks/{quote(task_id, safe='')}/gpu") if task.get("gpus") else None
    if json_out:
        if gpu is not None:
            task["gpu_use"] = {k: v for k, v in gpu.items() if k not in ("task_id", "points")}
        print_json(task)
        return
    out.print(Text.assemble((task["id"], "bold"), f"  {task['state']}  queue={task['queue']} team={task['team']}"))
    out.print(f"command: {shell_command(task['command'])}")
    if task.get("env"):
        out.print("env: " + " ".join(shell_command([f"{k}={v}"]) for k, v in sorted(task["env"].items())))
    if task.get("secret_env"):
        # The server sends *** for every value; print only the names, whatever came.
        out.print("secret env: " + " ".join(f"{k}=***" for k in sorted(task["secret_env"])))
    if task.get("working_dir"):
        out.print(f"working dir: {task['working_dir']}")
    if task.get("image"):
        pull = f" (pull secret {task['image_pull_secret']})" if task.get("image_pull_secret") else ""
        out.print(f"image: {task['image']}{pull}")
    retry = task.get("retry_on_exit_codes")
    nodes = int(task.get("nodes") or 1)
    out.print(
        f"gpus: {task['gpus']}{f' x {nodes} nodes' if nodes > 1 else ''}  {attempts_summary(task)} (attempts started {task['attempts']})  "
        f"exit: {task['exit_code']}  end: {end_text(task)}"
    )
    out.print(
        "retries: "
        + (f"only exit codes {', '.join(str(c) for c in retry)}" if retry else "every non-zero exit and timeout")
    )
    out.print(f"cost: {_figure(task.get('cost_usd'))} USD  gpu-hours: {_figure(task.get('gpu_hours'))}")
    out.print(runtime_line(task))
    if gpu is not None:
        out.print(gpu_use_line(gpu))
    if task.get("attempt_costs"):
        print_table(
            [
                {**a, "gpu_hours": _figure(a.get("gpu_hours")), "cost_usd": _figure(a.get("cost_usd"))}
                for a in task["attempt_costs"]
            ],
            ["attempt", "instance_id", "gpus", "started_at", "ended_at", "gpu_hours", "cost_usd"],
            title="attempts (cost as accrued by the last reconcile cycle)",
        )
    if task.get("ranks"):
        print_table(
            task["ranks"],
            ["attempt", "rank", "worker_id", "state", "gpu_indices", "exit_code", "end_reason", "started_at"],
            title="ranks",
        )
    if task.get("unschedulable_reason"):
        out.print(Text.assemble(("unschedulable: ", "bold red"), task["unschedulable_reason"]))
    print_table(
        task["events"],
        ["at", "from_state", "to_state", "reason", "attempt", "worker_id", "detail"],
        title="history",
    )


SPARK = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 60


def gpu_use_line(gpu: dict[str, Any]) -> str:
    """One line: mean utilisation, peak memory and a sparkline of the latest samples."""
    if not gpu["samples"]:
        return (
            f"gpu use: no samples (a sample every {gpu['sample_interval_s']:g} s while it runs, "
            f"kept {gpu['retention_days']:g} days)"
        )
    recent = [p["utilization_pct"] for p in gpu["points"][-SPARK_WIDTH:]]
    spark = "".join(SPARK[min(int(u / 100 * len(SPARK)), len(SPARK) - 1)] for u in recent)
    return (
        f"gpu use: mean {gpu['mean_utilization_pct']:.1f} % over {gpu['samples']} sample(s), peak memory "
        f"{gpu['peak_memory_used_mb']:,.0f} of {gpu['memory_total_mb']:,.0f} MB  {spark}"
    )


@task_app.command("why")
def task_why(
    task_id: str,
    server: ServerOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Why a task is waiting now (a team token reads its own team's tasks)."""
    answer = sdk_client(server, token, home).task(task_id).why().raw
    if json_out:
        print_json(answer)
        return
    out.print(f"{answer['task_id']}  {answer['state']}  [{answer['code']}]", markup=False, highlight=False)
    out.print(answer["reason"], markup=False, highlight=False)
    if answer.get("capacity"):
        out.print(f"capacity: {answer['capacity']['reason']}", markup=False, highlight=False)


@app.command()
def logs(
    task_id: str,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the task ends.")] = False,
    rank: Annotated[int | None, typer.Option(help="A multi-node task: only this rank's output.")] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
) -> None:
    """Print a task's output."""
    task = sdk_client(server, token, home).task(task_id)
    for chunk in task.logs(follow=follow, rank=rank):
        typer.echo(chunk.data, nl=False, err=chunk.stream == "stderr")
    if (why := start_failure(task.info())) is not None:
        # Its command never ran, so it wrote nothing: say why, where its errors would be.
        typer.echo(f"{task_id}: the command did not start: {why}", err=True)


def start_failure(task: TaskInfo) -> str | None:
    """Why a task that ended `start_failed` never ran (a missing program or working
    dir, as its history records it), or None for a task that ended otherwise."""
    if task.end_reason != "start_failed":
        return None
    details = [e.detail for e in task.events if e.reason == "start_failed" and e.detail]
    return details[-1] if details else "no reason was recorded (see `autoscaler task show`)"


@app.command()
def cancel(task_id: str, server: ServerOpt = None, token: TokenOpt = None, home: HomeOpt = None) -> None:
    """Cancel a task: removed if queued, stopped by its worker if running."""
    task = sdk_client(server, token, home).task(task_id).cancel()
    typer.echo(f"{task.id}: {'cancel requested' if task.cancel_requested else task.state}")


@app.command()
def queues(server: ServerOpt = None, token: TokenOpt = None, home: HomeOpt = None, json_out: JsonOpt = False) -> None:
    """List queues with depth, running tasks and oldest wait."""
    rows = client(server, token, home).get("/api/v1/queues")
    if json_out:
        print_json(rows)
    else:
        for r in rows:
            r["pools"] = ",".join(r["pools"])
            r["oldest_wait_s"] = None if r["oldest_wait_s"] is None else f"{r['oldest_wait_s']:.0f}"
        print_table(rows, ["name", "priority", "pools", "depth", "running", "oldest_wait_s"])


@app.command()
def workers(
    include_gone: bool = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """List workers (admin)."""
    rows = client(server, token, home).get("/api/v1/workers", include_gone=include_gone)
    if json_out:
        print_json(rows)
    else:
        print_table(
            rows,
            ["id", "instance_id", "hostname", "pool", "provider", "state", "gpu_count", "gpu_type", "last_heartbeat"],
        )


@app.command()
def instances(
    pool: str | None = None,
    include_terminated: bool = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """List instances this deployment launched."""
    rows = client(server, token, home).get("/api/v1/instances", pool=pool, include_terminated=include_terminated)
    if json_out:
        print_json(rows)
    else:
        print_table(
            rows, ["id", "pool", "provider", "instance_type", "capacity_type", "zone", "state", "team", "hourly_price"]
        )


@token_app.command("create")
def token_create(
    team: Annotated[str | None, typer.Option(help="Create a team token for this team.")] = None,
    join: Annotated[bool, typer.Option("--join", help="Create a one-time agent join token.")] = False,
    pool: Annotated[str | None, typer.Option(help="Pool of the join token.")] = None,
    admin: Annotated[bool, typer.Option("--admin", help="Create another admin token.")] = False,
    ttl: Annotated[str | None, typer.Option(help="Lifetime, e.g. 30m, 1h, 7d (join default 1h).")] = None,
    name: str = "",
    server: ServerOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Create a token; its value is printed once."""
    if sum([bool(team) and not join, join, admin]) != 1:
        raise InvalidInput("say which token: --team T, --join --pool P, or --admin")
    kind = "join" if join else ("admin" if admin else "team")
    body = {"kind": kind, "team": team, "pool": pool, "ttl_s": parse_duration(ttl) if ttl else None, "name": name}
    created = client(server, token, home).post("/api/v1/tokens", body)
    if json_out:
        print_json(created)
    else:
        typer.echo(created["token"])


def parse_duration(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        if text[-1] in units:
            return float(text[:-1]) * units[text[-1]]
        return float(text)
    except (ValueError, IndexError):
        raise InvalidInput(f"duration {text!r} not understood; use e.g. 90s, 30m, 1h, 7d") from None
