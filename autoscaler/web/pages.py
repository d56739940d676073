"""The dashboard's pages: overview, tasks, a task, fleet, decisions, charts, admin, login.

Every page resolves the viewer from the session cookie (see `session.py`) and
queries through `views.py` with the viewer's team, so a team member never sees
another team's data. Bad query parameters get a 422 page that says what is
accepted; an unknown or foreign task gets the same 404.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, RedirectResponse, Response
from markupsafe import Markup
from sqlalchemy.orm import Session

from autoscaler.admission.why_db import team_standing, why_task
from autoscaler.api.context import AppContext
from autoscaler.api.deps import Ctx, tx
from autoscaler.artifacts.records import list_artifacts
from autoscaler.auth import security
from autoscaler.auth.tokens import Principal
from autoscaler.errors import AutoscalerError, InvalidInput
from autoscaler.ledger import shared_pools
from autoscaler.notify.deliver import delivery_rows
from autoscaler.queueing import gangs, gpu_samples
from autoscaler.queueing.queues import known_queue
from autoscaler.queueing.states import TaskState
from autoscaler.reports.budgets import team_budgets
from autoscaler.reports.spend import TeamSpend, team_spend
from autoscaler.web import views
from autoscaler.web.charts import Series, line_chart
from autoscaler.web.render import render
from autoscaler.web.session import clear_session, cookie_principal, principal_for_token, set_session

router = APIRouter(include_in_schema=False)
STATIC = Path(__file__).parent / "static"
REFRESH_S = 5
PageHandler = Callable[..., Response]


def page(handler: PageHandler) -> PageHandler:
    """Turn a domain error into an HTML error page with its status (never a 500)."""

    @functools.wraps(handler)
    def wrapper(*args: object, **kwargs: object) -> Response:
        try:
            return handler(*args, **kwargs)
        except AutoscalerError as exc:
            return render("error.html", status=exc.http_status, viewer=None, message=exc.message, nav="")

    return wrapper


def _to_login(request: Request) -> Response:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/login?next={quote(target, safe='')}", status_code=303)


def _int(value: str | None, name: str, *, lo: int, hi: int, default: int) -> int:
    if value is None or value == "":
        return default
    if not value.isdigit() or not lo <= int(value) <= hi:
        raise InvalidInput(f"{name} must be a whole number from {lo} to {hi}, not {value[:40]!r}")
    return int(value)


def _team_of(viewer: Principal) -> str | None:
    return None if viewer.is_admin else viewer.team


def _spend(ctx: AppContext, s: Session, team: str | None) -> list[TeamSpend]:
    return team_spend(
        s,
        now=ctx.clock.now(),
        budgets=team_budgets(ctx.config),
        teams=[t.name for t in ctx.config.teams],
        only_team=team,
        shared=shared_pools(ctx.config),
    )


@router.get("/static/dashboard.css")
def stylesheet() -> FileResponse:
    return FileResponse(STATIC / "dashboard.css", media_type="text/css", headers={"Cache-Control": "max-age=300"})


@router.get("/login")
@page
def login_form(request: Request, ctx: Ctx, next: str | None = None) -> Response:
    with tx(ctx) as s:
        if cookie_principal(request, s, ctx) is not None:
            return RedirectResponse(_safe_next(next), status_code=303)
    return render(
        "login.html", viewer=None, nav="", error=None, next=_safe_next(next), token_file=_admin_token_file(ctx)
    )


def _admin_token_file(ctx: AppContext) -> str:
    """Where the server keeps the admin token (set by the server at start)."""
    return str(ctx.admin_token_file or "HOME/admin.token")


def _safe_next(target: str | None) -> str:
    # Only same-site paths: "//evil.example" or "https://..." would be an open redirect.
    if target and target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return "/"


@router.post("/login")
async def login(request: Request, ctx: Ctx) -> Response:
    form = parse_qs((await request.body()).decode("utf-8", "replace"), max_num_fields=10)
    token = (form.get("token") or [""])[0].strip()
    target = _safe_next((form.get("next") or ["/"])[0])
    if not token or len(token) > 256:
        return render(
            "login.html",
            status=401,
            viewer=None,
            nav="",
            error="paste an admin or team token",
            next=target,
            token_file=_admin_token_file(ctx),
        )
    try:
        with tx(ctx) as s:
            principal_for_token(request, s, ctx, token)
    except AutoscalerError as exc:
        return render(
            "login.html",
            status=exc.http_status,
            viewer=None,
            nav="",
            error=exc.message,
            next=target,
            token_file=_admin_token_file(ctx),
        )
    response = RedirectResponse(target, status_code=303)
    set_session(response, request, token)
    return response


@router.post("/logout")
def logout(request: Request) -> Response:
    response = RedirectResponse("/login", status_code=303)
    clear_session(response, request)
    return response


@router.get("/")
@page
def overview(request: Request, ctx: Ctx) -> Response:
    now = ctx.clock.now()
    with tx(ctx) as s:
        viewer = cookie_principal(request, s, ctx)
        if viewer is None:
            return _to_login(request)
        team = _team_of(viewer)
        charts = views.history(s, team, now, hours=6)
        return render(
            "overview.html",
            viewer=viewer,
            nav="overview",
            refresh=REFRESH_S,
            now=now,
            queues=views.queues(s, team, now),
            fleet=views.fleet_groups(s, team),
            spend=_spend(ctx, s, team),
            latest=views.decisions(s, team, limit=1),
            alerts=delivery_rows(s, limit=10, team=team),
            charts=[
                line_chart(views.CHART_TITLES.get(m, m), series, step=m in views.STEP_METRICS)
                for m, series in list(charts.items())[:3]
            ],
        )


@router.get("/tasks")
@page
def task_list(
    request: Request,
    ctx: Ctx,
    team: str | None = None,
    queue: str | None = None,
    state: str | None = None,
    limit: str | None = None,
) -> Response:
    if state and state not in {s.value for s in TaskState}:
        raise InvalidInput(f"unknown state {state[:40]!r}; one of: {', '.join(s.value for s in TaskState)}")
    if (team and len(team) > 64) or (queue and len(queue) > 64):
        raise InvalidInput("team and queue names are at most 64 characters")
    n = _int(limit, "limit", lo=1, hi=1000, default=200)
    with tx(ctx) as s:
        viewer = cookie_principal(request, s, ctx)
        if viewer is None:
            return _to_login(request)
        scope = _team_of(viewer)
        if scope is None and team:
            ctx.config.check_team(team)  # as the API and CLI do: a typo is said, not an empty list
        if queue:
            known_queue(s, queue, team=scope)  # the same for a queue
        rows = views.tasks(s, scope, queue=queue, state=state, team_filter=team, limit=n)
        return render(
            "tasks.html",
            viewer=viewer,
            nav="tasks",
            refresh=REFRESH_S,
            tasks=rows,
            now=ctx.clock.now(),
            filters={"team": team or "", "queue": queue or "", "state": state or ""},
            states=[x.value for x in TaskState],
            queues=[q.name for q in views.queues(s, scope, ctx.clock.now())],
            teams=[t.name for t in ctx.config.teams] if scope is None else [],
        )


@router.get("/tasks/{task_id}")
@page
def task_page(request: Request, ctx: Ctx, task_id: str) -> Response:
    with tx(ctx) as s:
        viewer = cookie_principal(request, s, ctx)
        if viewer is None:
            return _to_login(request)
        found = views.task_detail(s, _team_of(viewer), task_id)
        if found is None:
            return render(
                "error.html", status=404, viewer=viewer, nav="tasks", message=f"task {task_id[:64]} not found"
            )
        task, attempts = found
        now = ctx.clock.now()
        boot = {p.name: p.boot_timeout_s for p in ctx.config.pools}
        why = why_task(s, task, boot_timeouts=boot, now=now) if task.state == "queued" else None
        use = gpu_samples.task_use(s, task.id, now=now) if task.gpus else None
        return render(
            "task.html",
            gpu_use=use,
            gpu_chart=gpu_use_chart(use) if use is not None else None,
            retention=ctx.config.retention,
            viewer=viewer,
            nav="tasks",
            refresh=REFRESH_S,
            task=task,
            attempts=attempts,
            why=why,
            now=now,
            artifacts=list_artifacts(s, task.id),
            ranks=gangs.all_ranks(s, task.id),
        )


def gpu_use_chart(use: gpu_samples.GpuUse) -> Markup:
    """Utilisation and memory (both in % of the task's GPUs) over the task's attempts."""
    return line_chart(
        "GPU use of this task (%)",
        [
            Series("utilisation", [(p.at, p.utilization_pct) for p in use.points]),
            Series(
                "memory",
                [(p.at, p.memory_used_mb / p.memory_total_mb * 100) for p in use.points if p.memory_total_mb > 0],
            ),
        ],
        unit=" %",
    )


@router.get("/fleet")
@page
def fleet(request: Request, ctx: Ctx, all: str | None = None) -> Response:
    now = ctx.clock.now()
    with tx(ctx) as s:
        viewer = cookie_principal(request, s, ctx)
        if viewer is None:
            return _to_login(request)
        team = _team_of(viewer)
        return render(
            "fleet.html",
            viewer=viewer,
            nav="fleet",
            refresh=REFRESH_S,
            show_all=all == "1",
            instances=views.instances(s, team, now, include_terminated=all == "1"),
            workers=views.unattached_workers(s, team),
            reclaims=views.reclaim_rates(s, ctx.config.capacity, now),
            reclaim_prior=ctx.config.capacity.reclaim_prior_per_hour,
        )


@router.get("/decisions")
@page
def decisions(request: Request, ctx: Ctx, limit: str | None = None) -> Response:
    n = _int(limit, "limit", lo=1, hi=500, default=50)
    with tx(ctx) as s:
        viewer = cookie_principal(request, s, ctx)
        if viewer is None:
            return _to_login(request)
        team = _team_of(viewer)
        now_verdict = team_standing(s, team) if team is not None else None
        return render(
            "decisions.html",
            viewer=viewer,
            nav="decisions",
            refresh=REFRESH_S * 2,
            decisions=views.decisions(s, team, n, now_verdict),
            now_verdict=now_verdict,
        )


@router.get("/charts")
@page
def charts(request: Request, ctx: Ctx, hours: str | None = None) -> Response:
    n = _int(hours, "hours", lo=1, hi=24 * 31, default=6)
    with tx(ctx) as s:
        viewer = cookie_principal(request, s, ctx)
        if viewer is None:
            return _to_login(request)
        series = views.history(s, _team_of(viewer), ctx.clock.now(), hours=n)
        return render(
            "charts.html",
            viewer=viewer,
            nav="charts",
            refresh=REFRESH_S * 6,
            hours=n,
            charts=[
                line_chart(views.CHART_TITLES.get(m, m), ss, step=m in views.STEP_METRICS) for m, ss in series.items()
            ],
        )


@router.get("/admin")
@page
def admin(request: Request, ctx: Ctx) -> Response:
    """Admins only: security events (refused registrations, replays, authorization failures)."""
    with tx(ctx) as s:
        viewer = cookie_principal(request, s, ctx)
        if viewer is None:
            return _to_login(request)
        if not viewer.is_admin:
            return render("error.html", status=403, viewer=viewer, nav="", message="the admin page is for admins")
        return render(
            "admin.html",
            viewer=viewer,
            nav="admin",
            refresh=REFRESH_S * 2,
            counts=security.counts(s),
            by_token=security.failures_by_token(s, limit=50),
            events=security.recent(s, limit=100),
        )
