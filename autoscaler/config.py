"""The deployment's configuration: one YAML file (`autoscaler.yaml`) validated by pydantic.

It declares teams, queues and pools, the policy engine, the database and the listen
address. Environment variables (`AUTOSCALER_*`, see `Settings`) override the file's
top-level scalars so containers and Terraform can inject them without templating YAML.

A bad file is refused by `load_config` with the file, the key path and what was
expected, as a `ConfigError` whose message is meant for the user (no traceback).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError
from pydantic_settings import BaseSettings, SettingsConfigDict

from autoscaler.errors import ConfigError, InvalidInput
from providers.base import DriverOptions, option_problems

NAME_RE = r"^[a-z0-9][a-z0-9_.-]{0,62}$"
CapacityType = Literal["spot", "on_demand"]
ProviderKind = Literal["local", "fake", "aws", "gcp", "azure", "static", "slurm"]


def default_home() -> Path:
    """Where `autoscaler up` keeps its SQLite file, logs and admin token."""
    return Path(os.environ.get("AUTOSCALER_HOME", Path.home() / ".autoscaler"))


def _spot_then_on_demand() -> list[CapacityType]:
    return ["spot", "on_demand"]


class _Strict(BaseModel):
    # Unknown keys are almost always typos ("max_instance"); refusing them is kinder
    # than silently ignoring a limit the user believes is in force.
    model_config = ConfigDict(extra="forbid")


# The team of work an admin enqueues without naming one.
DEFAULT_TEAM = "default"


class TeamConfig(_Strict):
    name: str = Field(pattern=NAME_RE, description="Team id used in tokens, tasks and policies.")
    description: str = ""


class QueueConfig(_Strict):
    name: str = Field(pattern=NAME_RE)
    pools: list[str] = Field(min_length=1, description="Pools whose workers serve this queue, in preference order.")
    priority: int = Field(0, description="Higher queues are leased first.")
    teams: list[str] = Field(default_factory=list, description="Teams allowed to enqueue; empty = every team.")


class SimulatedGpus(_Strict):
    """A GPU inventory reported by agents on machines without GPUs (local runs, tests)."""

    count: int = Field(ge=0, le=64)
    model: str = "Simulated GPU"
    memory_mb: int = Field(16384, ge=0)


class InstanceTypeConfig(_Strict):
    """An instance shape a pool may launch; prices fall back to this when the provider has none."""

    name: str
    gpus: int = Field(0, ge=0)
    gpu_type: str | None = None
    cpus: int = Field(1, ge=1)
    memory_mb: int = Field(1024, ge=1)
    on_demand_price: float | None = Field(None, ge=0, description="USD per hour.")
    spot_price: float | None = Field(None, ge=0, description="USD per hour.")


class PoolConfig(_Strict):
    name: str = Field(pattern=NAME_RE)
    provider: ProviderKind
    region: str = "local"
    zones: list[str] = Field(default_factory=list)
    instance_types: list[InstanceTypeConfig] = Field(default_factory=list)
    capacity_types: list[CapacityType] = Field(default_factory=_spot_then_on_demand, description="Preference order.")
    min_instances: int = Field(0, ge=0)
    max_instances: int = Field(10, ge=0)
    idle_timeout_s: float = Field(
        300, gt=0, description="The longest an idle worker is kept; it is drained after this long."
    )
    warm_pool: Literal["adaptive", "fixed"] = Field(
        "adaptive",
        description="adaptive: keep only as many idle machines of a kind as the pool's recent task starts "
        "would use before a fresh one boots; the others drain after 30 s (docs/configuration.md); "
        "fixed: keep every idle machine for idle_timeout_s.",
    )
    boot_timeout_s: float = Field(900, gt=0, description="An instance not registered by then is terminated.")
    image: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    simulated_gpus: SimulatedGpus | None = None
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="Provider-specific settings, checked against the provider's options model "
        "(docs/providers.md); an unknown key is an error.",
    )
    tenancy: Literal["team", "shared"] = Field(
        "team",
        description=(
            "team: a machine runs one team's work at a time (the team whose demand launched it, or, for a "
            "machine launched for no team, whichever team holds it now); shared: teams may share a machine "
            "and its uid boundary."
        ),
    )
    unused_cost: Literal["launcher", "shared"] = Field(
        "launcher",
        description="Who pays for a machine's time with free GPUs (boot, idle, fragmentation): the team whose "
        "demand launched it, or the pool's `shared` line. Time a task holds GPUs is always its team's.",
    )

    @model_validator(mode="after")
    def _min_le_max(self) -> PoolConfig:
        if self.min_instances > self.max_instances:
            raise ValueError(f"min_instances ({self.min_instances}) exceeds max_instances ({self.max_instances})")
        return self

    @model_validator(mode="after")
    def _options_fit_the_provider(self) -> PoolConfig:
        """Check `options` against the model of `provider`, each problem at its key path
        (`pools.2.options.subnet: unknown option; did you mean 'subnets'?`)."""
        model = options_model(self.provider)
        try:
            model.model_validate(self.options)
        except ValidationError as exc:
            details: list[InitErrorDetails] = [
                {
                    "type": PydanticCustomError("pool_option", "{problem}", {"problem": problem}),
                    "loc": ("options", *loc),
                    "input": self.options,
                }
                for loc, problem in option_problems(model, exc)
            ]
            raise ValidationError.from_exception_data(type(self).__name__, details) from None
        return self


def options_model(provider: ProviderKind) -> type[DriverOptions]:
    """The `options:` model of each provider: the config's union keyed by `provider`.

    Imported on use, so a deployment loads the settings modules of its own pools only
    (none of them imports a cloud SDK)."""
    if provider == "aws":
        from providers.aws.settings import AwsOptions

        return AwsOptions
    if provider == "gcp":
        from providers.gcp.settings import GcpOptions

        return GcpOptions
    if provider == "azure":
        from providers.azure.settings import AzureOptions

        return AzureOptions
    if provider == "slurm":
        from providers.slurm.settings import SlurmOptions

        return SlurmOptions
    if provider == "static":
        from providers.static.settings import StaticOptions

        return StaticOptions
    if provider == "local":
        from providers.local import LocalOptions

        return LocalOptions
    from providers.fake import FakeOptions

    return FakeOptions


class PolicyConfig(_Strict):
    engine: Literal["embedded", "opa"] = "embedded"
    interpreter: Literal["regorus", "rego-cpp"] = Field(
        "regorus", description="The embedded engine's Rego interpreter (docs/policies.md, 'Engines')."
    )
    dir: str | None = Field(None, description="Policy directory; default: the policies shipped with the package.")
    data_dir: str | None = Field(
        None,
        description="A directory of policy data files (budgets.yaml, placement.yaml, priorities.yaml) that "
        "replace the policy directory's files of the same name: this deployment's teams, without copying the "
        "rules. A relative path is taken from the config file's directory.",
    )
    opa_url: str | None = None
    package: str = "autoscaler"
    timeout_s: float = Field(2.0, gt=0)


class ReconcileConfig(_Strict):
    interval_s: float = Field(15.0, gt=0)
    debounce_s: float = Field(1.0, ge=0)
    heartbeat_timeout_s: float = Field(60.0, gt=0)
    orphan_grace_s: float = Field(120.0, ge=0)
    unavailable_ttl_s: float = Field(180.0, gt=0)
    rebalance_drain_deadline_s: float | None = Field(
        None,
        ge=0,
        description=(
            "After a rebalance recommendation (AWS), how long running tasks may go on before they are "
            "interrupted; None: they are not (the worker only stops taking new tasks)."
        ),
    )
    enabled: bool = True


class GangConfig(_Strict):
    """Multi-node tasks (docs/gangs.md)."""

    reservation_timeout_s: float = Field(
        120.0,
        gt=0,
        description="A gang's partial reservation (some ranks hold GPUs, the others wait for machines) older "
        "than this is released, so gangs never wait on each other for ever.",
    )
    master_port_min: int = Field(
        29500, ge=1024, le=65535, description="MASTER_PORT is chosen per gang from [min, max)."
    )
    master_port_max: int = Field(30500, ge=1025, le=65536)

    @model_validator(mode="after")
    def _ports(self) -> GangConfig:
        if self.master_port_min >= self.master_port_max:
            raise ValueError(
                f"gangs.master_port_min ({self.master_port_min}) must be below master_port_max ({self.master_port_max})"
            )
        return self


class RetentionConfig(_Strict):
    """How long history is kept. A prune in the server deletes what is older, once at
    start and then daily (docs/operations.md#retention); 0 keeps that history forever."""

    task_logs_days: float = Field(
        30.0, ge=0, description="Output of tasks that finished more than this many days ago is deleted."
    )
    task_events_days: float = Field(
        90.0,
        ge=0,
        description="State changes of tasks that finished more than this many days ago are deleted (the task "
        "row, its attempts and its cost stay: spend reports need them).",
    )
    decisions_days: float = Field(30.0, ge=0, description="Reconcile decision records older than this are deleted.")
    metrics_days: float = Field(
        30.0, ge=0, description="Chart history (queue depth, fleet size, spend points) older than this is deleted."
    )
    gpu_samples_days: float = Field(
        7.0, ge=0, description="Per-worker GPU utilisation and memory samples older than this are deleted."
    )
    gpu_sample_interval_s: float = Field(
        30.0,
        ge=0,
        description="At most one GPU sample per worker per this many seconds (heartbeats come more often); "
        "0 records every heartbeat.",
    )
    prune_interval_h: float = Field(24.0, gt=0, description="How often the prune runs (hours); it also runs at start.")


class ServerConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    public_url: str | None = Field(None, description="URL agents use to reach the API; default http://host:port.")
    tls_terminated_upstream: bool = Field(False, description="Allow a non-loopback listen address without TLS.")
    secret_key_file: str | None = Field(
        None,
        description="Keys sealing task secret_env (first seals, all open); default HOME/secret.key, created "
        "0600 on first start. A relative path is relative to HOME.",
    )


class ArtifactsConfig(_Strict):
    """Where code snapshots, task outputs and checkpoints are kept (docs/artifacts.md)."""

    store: Literal["local", "s3", "gcs", "azure"] = Field(
        "local",
        description="local: a directory on the server (HOME/artifacts); s3: a bucket (boto3); gcs: a bucket "
        "(google-cloud-storage); azure: a blob container (azure-storage-blob).",
    )
    path: str = Field("artifacts", description="The local store's directory; a relative path is relative to HOME.")
    bucket: str | None = Field(None, description="s3, gcs: the bucket; azure: the blob container.")
    prefix: str = Field("", description="s3, gcs, azure: a key prefix inside the bucket or container.")
    region: str | None = Field(None, description="s3: the bucket's region; default boto3's.")
    project: str | None = Field(None, description="gcs: the project; default the credentials' own.")
    endpoint_url: str | None = Field(
        None,
        description="s3: another S3-compatible endpoint (MinIO, moto); gcs: another endpoint (an emulator); "
        "azure: the account's blob URL (https://ACCOUNT.blob.core.windows.net), used with the server's Entra ID "
        "identity unless AZURE_STORAGE_CONNECTION_STRING is set in its environment.",
    )
    retention_days: float = Field(
        30, gt=0, description="Artifacts and snapshots older than this are deleted (snapshots a live task uses stay)."
    )
    max_snapshot_bytes: int = Field(1024**3, ge=1, description="Largest code snapshot accepted.")
    max_artifact_bytes: int = Field(50 * 1024**3, ge=1, description="Largest output or checkpoint accepted.")
    ticket_ttl_s: int = Field(
        3600, ge=60, le=7 * 86400, description="How long a download ticket a worker gets with its lease stays valid."
    )


class RetryConfig(_Strict):
    """Backoff between delivery attempts: initial_s, doubled each failure, capped at max_s."""

    initial_s: float = Field(10.0, gt=0)
    max_s: float = Field(600.0, gt=0)
    max_attempts: int = Field(0, ge=0, description="Give up after this many attempts; 0 = never give up.")


class WebhookChannel(_Strict):
    """POST of the documented JSON body (docs/operations.md), optionally HMAC-signed."""

    name: str = Field(pattern=NAME_RE)
    type: Literal["webhook"]
    url: str
    secret: str | None = Field(None, description="HMAC-SHA256 key for the X-Autoscaler-Signature header.")
    secret_env: str | None = Field(None, description="Environment variable holding the HMAC key.")
    headers: dict[str, str] = Field(default_factory=dict)
    timeout_s: float = Field(10.0, gt=0)


class SlackChannel(_Strict):
    """A Slack-compatible incoming webhook (Slack, Mattermost, Rocket.Chat): `{"text": ...}`."""

    name: str = Field(pattern=NAME_RE)
    type: Literal["slack"]
    url: str | None = None
    url_env: str | None = Field(None, description="Environment variable holding the webhook URL (it is a secret).")
    timeout_s: float = Field(10.0, gt=0)

    @model_validator(mode="after")
    def _has_url(self) -> SlackChannel:
        if not self.url and not self.url_env:
            raise ValueError(f"channel {self.name!r}: set url or url_env")
        return self


class EmailChannel(_Strict):
    """Mail over SMTP; STARTTLS unless `starttls: false`; AUTH when a username is set."""

    name: str = Field(pattern=NAME_RE)
    type: Literal["email"]
    host: str
    port: int = Field(587, ge=1, le=65535)
    starttls: bool = True
    ca_file: str | None = Field(None, description="CA bundle to verify the server's certificate (default: system).")
    username: str | None = None
    username_env: str | None = None
    password: str | None = None
    password_env: str | None = Field(None, description="Environment variable holding the SMTP password.")
    sender: str = Field(alias="from")
    to: list[str] = Field(min_length=1)
    timeout_s: float = Field(10.0, gt=0)

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class AlertmanagerChannel(_Strict):
    """Prometheus Alertmanager, API v2 (`POST <url>/api/v2/alerts`)."""

    name: str = Field(pattern=NAME_RE)
    type: Literal["alertmanager"]
    url: str = Field(description="Base URL, e.g. http://alertmanager:9093.")
    timeout_s: float = Field(10.0, gt=0)
    active_for_s: float = Field(
        3600.0, gt=0, description="endsAt of a non-budget alert; a budget alert lasts until its period ends."
    )


ChannelConfig = Annotated[
    WebhookChannel | SlackChannel | EmailChannel | AlertmanagerChannel, Field(discriminator="type")
]
AlertKind = Literal["budget", "budget_freeze", "budget_drain", "pool_backoff", "never_registered", "fail_safe"]
AlertLevel = Literal["info", "warning", "critical"]


class RouteConfig(_Strict):
    """Alerts matching every given filter go to `channels` (an empty filter matches all)."""

    channels: list[str] = Field(min_length=1)
    teams: list[str] = Field(default_factory=list, description='Team names; "-" matches fleet alerts (no team).')
    levels: list[AlertLevel] = Field(default_factory=list)
    kinds: list[AlertKind] = Field(default_factory=list)


class NotificationsConfig(_Strict):
    channels: list[ChannelConfig] = Field(default_factory=list)
    routes: list[RouteConfig] = Field(default_factory=list, description="Empty: every alert goes to every channel.")
    interval_s: float = Field(10.0, gt=0, description="How often pending deliveries are sent.")
    retry: RetryConfig = Field(default_factory=RetryConfig)
    pool_backoff_minutes: float = Field(15.0, ge=0, description="Alert when a pool stays in launch backoff this long.")
    fail_safe_minutes: float = Field(0.0, ge=0, description="Alert when the policy fails safe for this long.")

    @field_validator("channels")
    @classmethod
    def _unique_channels(cls, items: list[Any]) -> list[Any]:
        names = [c.name for c in items]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"duplicate channel name(s) {dup}")
        return items

    @model_validator(mode="after")
    def _route_channels(self) -> NotificationsConfig:
        known = {c.name for c in self.channels}
        for route in self.routes:
            for name in route.channels:
                if name not in known:
                    raise ValueError(f"route names unknown channel {name!r} (known: {sorted(known)})")
        return self

    def channel(self, name: str) -> ChannelConfig | None:
        return next((c for c in self.channels if c.name == name), None)


class CapacityConfig(_Strict):
    """The per-task choice between spot and on-demand (docs/capacity.md): the priors of
    its two estimates and what a reclaim costs in waiting."""

    reclaim_prior_per_hour: float = Field(
        0.24,
        ge=0,
        description="Spot reclaims per instance-hour believed before any is observed (the simulator's rate).",
    )
    reclaim_prior_hours: float = Field(
        20.0, ge=0, description="Instance-hours of evidence the prior is worth (0: the data alone)."
    )
    reclaim_half_life_h: float = Field(
        336.0, gt=0, description="Hours after which an observed instance-hour counts half (default 14 days)."
    )
    runtime_prior_h: float = Field(
        1.0, gt=0, description="Median run time (hours) of a task with no declaration and no history."
    )
    runtime_prior_sigma: float = Field(1.0, gt=0, description="Spread of ln(run time) in the prior.")
    runtime_prior_weight: float = Field(2.0, gt=0, description="Runs of history the prior is worth.")
    boot_s: float = Field(180.0, ge=0, description="Seconds a fresh machine takes to boot and take the task.")
    # Off by default: measured on the Philly traces, a 30 min target keeps long
    # checkpointing tasks on on-demand and triples their cost (docs/capacity.md).
    wait_target_s: float | None = Field(
        None,
        gt=0,
        description="Wait target (seconds of a task's wait, summed over its attempts): a task cheaper on spot "
        "whose boots after reclaims would pass it (chance over 5 %) gets on-demand; null (default): no target.",
    )
    standby: bool = Field(
        True,
        description="With a wait target: keep booted spot machines standing by for checkpointing tasks on spot, so "
        "a reclaimed one moves at its notice instead of waiting a boot (and keeps spot, not on-demand); false: no "
        "standby machines.",
    )
    standby_scope: Literal["shared", "team"] = Field(
        "shared",
        description="shared: standby machines stand by for every team with the same placement (launched for no team: "
        "the shared line pays their idle time, a team pays from when its task takes one); team: each team's own, "
        "launched for and billed to it.",
    )
    enabled: bool = Field(True, description="False: the pool's capacity-type order alone decides (spot first).")


class AutoscalerConfig(_Strict):
    deployment: str = Field("autoscaler", pattern=NAME_RE, description="Owner tag on every instance.")
    database_url: str | None = None
    server: ServerConfig = Field(default_factory=ServerConfig)
    teams: list[TeamConfig] = Field(default_factory=list)
    queues: list[QueueConfig] = Field(default_factory=list)
    pools: list[PoolConfig] = Field(default_factory=list)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    reconcile: ReconcileConfig = Field(default_factory=ReconcileConfig)
    notifications: NotificationsConfig = Field(default_factory=NotificationsConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    gangs: GangConfig = Field(default_factory=GangConfig)
    artifacts: ArtifactsConfig = Field(default_factory=ArtifactsConfig)
    capacity: CapacityConfig = Field(default_factory=CapacityConfig)

    @field_validator("teams", "queues", "pools")
    @classmethod
    def _unique_names(cls, items: list[Any]) -> list[Any]:
        seen: set[str] = set()
        for item in items:
            if item.name in seen:
                raise ValueError(f"duplicate name {item.name!r}")
            seen.add(item.name)
        return items

    @model_validator(mode="after")
    def _references(self) -> AutoscalerConfig:
        pools = {p.name for p in self.pools}
        teams = {t.name for t in self.teams}
        for q in self.queues:
            for p in q.pools:
                if p not in pools:
                    raise ValueError(f"queue {q.name!r} names unknown pool {p!r} (known: {sorted(pools)})")
            for t in q.teams:
                if t not in teams:
                    raise ValueError(f"queue {q.name!r} names unknown team {t!r} (known: {sorted(teams)})")
        return self

    def pool(self, name: str) -> PoolConfig | None:
        return next((p for p in self.pools if p.name == name), None)

    def team_names(self) -> list[str]:
        """The teams a task can belong to: `default` (admin-enqueued work) and `teams:`."""
        return [DEFAULT_TEAM, *(t.name for t in self.teams)]

    def check_team(self, name: str) -> None:
        """Refuse a team this deployment does not declare (an admin's `--team` typo would
        otherwise queue work, or filter a report, for a team that cannot exist). The
        catch-all team of admin-enqueued work, `default`, always exists."""
        if name in self.team_names():
            return
        known = ", ".join(self.team_names())
        raise InvalidInput(
            f"unknown team {name[:64]!r} (known: {known}): check the spelling, or add it under "
            "teams: in autoscaler.yaml and restart the server"
        )

    def warnings(self) -> list[str]:
        """What a config that loads may still lack to be useful, said at start."""
        out = []
        if not self.queues:
            out.append(
                "no queues configured: every enqueue will be refused; add queues: to autoscaler.yaml "
                "(examples/local.yaml shows one)"
            )
        if not self.pools:
            out.append("no pools configured: no machine can be launched or join; add pools: to autoscaler.yaml")
        if not self.teams:
            out.append(
                "no teams configured: only admins can enqueue (for team 'default') and no team token can be "
                "created; add teams: to autoscaler.yaml"
            )
        return out

    def queue(self, name: str) -> QueueConfig | None:
        return next((q for q in self.queues if q.name == name), None)


class Settings(BaseSettings):
    """Environment overrides, read as `AUTOSCALER_<NAME>`."""

    model_config = SettingsConfigDict(env_prefix="AUTOSCALER_", extra="ignore")

    config: Path | None = None
    home: Path = Field(default_factory=default_home)
    database_url: str | None = None
    host: str | None = None
    port: int | None = None
    public_url: str | None = None
    secret_key_file: str | None = None


def read_environment() -> Settings:
    """The `AUTOSCALER_*` overrides; a value of the wrong kind (`AUTOSCALER_PORT=abc`)
    is a ConfigError naming the variable, not pydantic's traceback."""
    try:
        return Settings()
    except ValidationError as err:
        problems = "; ".join(
            f"{Settings.model_config['env_prefix']}{str(e['loc'][0]).upper()}={e.get('input')!r}: {e['msg']}"
            for e in err.errors()
        )
        raise ConfigError(f"environment: {problems}") from None


def _format_error(path: Path, err: ValidationError) -> str:
    lines = [f"{path}: invalid configuration"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        lines.append(f"  at {loc}: {e['msg']}")
    return "\n".join(lines)


def parse_config(text: str, source: Path) -> AutoscalerConfig:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{source}{where}: not valid YAML: {problem}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(raw).__name__}")
    try:
        cfg = AutoscalerConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_format_error(source, exc)) from None
    data_dir = cfg.policy.data_dir
    if data_dir is not None and not Path(data_dir).is_absolute():
        # Relative to the file, not to wherever the server was started from.
        policy = cfg.policy.model_copy(update={"data_dir": str(source.parent / data_dir)})
        cfg = cfg.model_copy(update={"policy": policy})
    return cfg


def load_config(path: Path | None = None, settings: Settings | None = None) -> AutoscalerConfig:
    """Read and validate the config file, then apply environment overrides."""
    settings = settings or read_environment()
    path = path or settings.config
    if path is None:
        cfg = AutoscalerConfig()
    else:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read configuration: {exc.strerror}") from None
        cfg = parse_config(text, Path(path))
    overrides: dict[str, Any] = {}
    if settings.database_url:
        overrides["database_url"] = settings.database_url
    server = cfg.server.model_copy(
        update={
            k: v
            for k, v in {
                "host": settings.host,
                "port": settings.port,
                "public_url": settings.public_url,
                "secret_key_file": settings.secret_key_file,
            }.items()
            if v is not None
        }
    )
    return cfg.model_copy(update={**overrides, "server": server})
