"""The provider contract: the handful of calls the reconciler makes on any backend.

Contract (every implementation must honour it; the fake provider's tests check it):

- **Idempotent by request id.** `launch(request)` with a `request_id` already seen
  returns the instances of the first call and starts nothing new. Cloud drivers pass
  the id as the cloud's idempotency key (AWS ClientToken, GCP requestId, Azure
  deterministic VM name) *and* tag every instance with it, so a crash between the
  call and the record can be repaired by `list`.
- **Eventually consistent listings.** `list(owner)` may lag a launch or terminate by
  seconds; the reconciler never treats a missing instance as gone on one listing
  alone (it waits for a grace period).
- **Terminate is idempotent.** Terminating an instance that is already gone succeeds.
- **Typed errors with a scope.** Errors say what they block so the reconciler can
  fall back: a `CapacityError` scoped to an offering tries another instance type or
  zone; scoped to a region tries another region; scoped to the provider tries
  another provider. Nothing else may escape `launch`/`list`/`terminate` except
  `ProviderError` subclasses.
- **Lazy SDK imports.** A driver imports its SDK when constructed, through
  `import_extra`, which raises `MissingExtra` (one line naming the extra to install)
  when it is absent, so the control plane starts without every cloud SDK installed.
- **Checked settings.** A driver's `options:` are a `DriverOptions` model (unknown keys
  refused); `parse_options` turns a bad mapping into one `InvalidRequest` line, and
  the config loader reports the same problems with their key paths (`option_problems`).
- **One error shape.** A cloud driver's `errors.map_error(code, message, http_status)`
  turns the backend's answer into one of the typed errors below.
- **One constructor shape.** `Driver(settings, offerings, *, test seams...)`: the
  validated settings, the catalog the pool may launch, then keyword-only seams
  (clients, credentials, clocks) that production leaves at their defaults.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from types import ModuleType
from typing import Any, Literal, Protocol, TypeVar, get_args, runtime_checkable

from pydantic import BaseModel, ConfigDict, ValidationError

CapacityType = Literal["spot", "on_demand"]

# Tag (label) keys every instance carries; GCP labels allow only [a-z0-9_-].
TAG_OWNER = "autoscaler-owner"
TAG_POOL = "autoscaler-pool"
TAG_REQUEST = "autoscaler-request-id"
TAG_TEAM = "autoscaler-team"
TAG_GANG = "autoscaler-gang"


@dataclass(frozen=True)
class Offering:
    """One launchable shape: an instance type in a zone with a capacity type and price."""

    instance_type: str
    capacity_type: CapacityType
    zone: str | None
    gpus: int
    gpu_type: str | None
    cpus: int
    memory_mb: int
    hourly_price: float
    region: str | None = None

    @property
    def key(self) -> str:
        """The unit a capacity error marks unavailable (Karpenter's choice)."""
        return f"{self.capacity_type}/{self.instance_type}/{self.zone or '-'}"


@dataclass(frozen=True)
class LaunchRequest:
    """One instance of one offering, or one gang of `nodes` instances, as the reconciler
    asks for it.

    Exactly what the reconciler sets, nothing more: the planner has already chosen the
    offering (zone, capacity type) and applied the policy's spot price cap, so there are
    no alternatives, zones or price caps for a driver to second-guess.

    **Gangs** (`nodes` > 1, `gang` = the gang's id): the driver launches exactly `nodes`
    instances of the offering in ONE zone, all or nothing. On a partial result it
    terminates what it started and raises `CapacityError` (scope OFFERING), so the
    planner retries the whole gang elsewhere; a half gang is never left billing. Every
    returned `ProviderInstance` carries `request_id` and the tag `autoscaler-gang`
    (`TAG_GANG`) with the gang id. `launch` stays idempotent per `request_id`: a retry
    after a crash finds the N instances, or finishes or cleans a partial set. After a
    gang launch raised, a new attempt takes a new `request_id`: the clouds' idempotency
    keys (EC2 ClientToken, GCP requestId) replay the first attempt. Where the
    cloud has one, the pool's placement option (AWS cluster placement group, GCP compact
    placement policy, Azure proximity placement group) puts the N machines close
    together. A driver that cannot launch `nodes` machines at all raises
    `InvalidRequest`; `Capabilities.max_gang_nodes` tells the planner beforehand.
    `nodes` = 1 with no `gang` is a single machine, unchanged.
    """

    request_id: str
    pool: str
    owner: str
    offering: Offering
    image: str | None = None
    user_data: str = ""
    tags: Mapping[str, str] = field(default_factory=dict)
    nodes: int = 1
    gang: str | None = None

    def all_tags(self) -> dict[str, str]:
        tags = {
            **self.tags,
            TAG_OWNER: self.owner,
            TAG_POOL: self.pool,
            TAG_REQUEST: self.request_id,
        }
        if self.gang is not None:
            tags[TAG_GANG] = self.gang
        return tags


class InstanceStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    STOPPING = "stopping"
    TERMINATED = "terminated"
    PREEMPTED = "preempted"


@dataclass(frozen=True)
class ProviderInstance:
    """What the provider reports about one instance."""

    instance_id: str
    request_id: str | None
    pool: str | None
    instance_type: str
    capacity_type: CapacityType
    zone: str | None
    status: InstanceStatus
    launched_at: datetime | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    private_ip: str | None = None


@dataclass(frozen=True)
class InterruptionEvent:
    """A provider's advance notice that an instance will be taken away (spot reclaim, rebalance).

    A second signal beside the agent's own metadata watcher: the reconciler drains the
    worker on either, whichever comes first.
    """

    instance_id: str
    kind: Literal["interruption", "rebalance"]
    at: datetime
    # When the provider will take the instance (about two minutes after an AWS notice).
    deadline: datetime | None = None
    # The provider's words, for the instance's history ("EC2 Spot Instance Interruption Warning").
    detail: str = ""
    # The provider's handle for acknowledging this notice (an SQS receipt handle), if it
    # must be acknowledged; see `AcknowledgedInterruptions`.
    receipt: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Capabilities:
    """What the reconciler asks of a driver beyond the four calls."""

    # The driver is an `InterruptionSource` worth polling every cycle.
    interruption_events: bool = False
    # Static pools: the reconciler never launches or terminates, only drains.
    static: bool = False
    # The most machines one gang launch (`LaunchRequest.nodes`) may ask for; None = no
    # driver limit (the cloud's quotas still apply). 1 = the driver launches no gangs.
    max_gang_nodes: int | None = None


class Scope(StrEnum):
    OFFERING = "offering"
    ZONE = "zone"
    REGION = "region"
    PROVIDER = "provider"


class ProviderError(Exception):
    """Base of every error a provider may raise; `retryable` says whether to try again."""

    retryable = False

    def __init__(self, message: str, *, scope: Scope = Scope.OFFERING, code: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.scope = scope
        self.code = code


class CapacityError(ProviderError):
    """No capacity for this offering/zone/region now: mark it unavailable and fall back."""


class QuotaError(ProviderError):
    """An account limit: mark the scope unavailable; an operator must raise the quota."""


class RateLimited(ProviderError):
    """Throttled: back off at least `retry_after_s`; nothing is marked unavailable."""

    retryable = True

    def __init__(self, message: str, *, retry_after_s: float = 5.0, code: str = "") -> None:
        super().__init__(message, scope=Scope.PROVIDER, code=code)
        self.retry_after_s = retry_after_s


class NotFound(ProviderError):
    """The instance does not exist: for terminate, that is success."""


class AuthError(ProviderError):
    """Credentials missing or not allowed: stop using this provider until fixed."""

    def __init__(self, message: str, *, code: str = "") -> None:
        super().__init__(message, scope=Scope.PROVIDER, code=code)


class InvalidRequest(ProviderError):
    """The request itself is wrong (bad image, bad type): a config error, not capacity."""


class TransientError(ProviderError):
    """A timeout or 5xx from the provider: retry later with backoff."""

    retryable = True

    def __init__(self, message: str, *, code: str = "") -> None:
        super().__init__(message, scope=Scope.PROVIDER, code=code)


class MissingExtra(ProviderError):
    """A driver's SDK is not installed: the pool cannot run until the extra is."""

    def __init__(self, extra: str, package: str) -> None:
        super().__init__(
            f"this pool needs the '{extra}' extra ({package} is not installed): pip install 'gpu-autoscaler[{extra}]'",
            scope=Scope.PROVIDER,
            code="MissingExtra",
        )
        self.extra = extra
        self.package = package


def gang_rollback_error(
    request: LaunchRequest,
    exc: ProviderError,
    *,
    delete_all: Callable[[], None],
    started: int,
    where: str,
    placement_fix: str | None = None,
) -> ProviderError:
    """Delete a gang's machines after one of them failed to launch; the error to raise.

    For a driver that makes a gang one machine at a time (GCP, Azure). `delete_all`
    deletes every index of the request, not only those this call made: a crashed
    earlier attempt may have left later ones, and deleting a missing one is success.
    What the caller gets:
    - the cleanup failed: `TransientError`, so the next launch of this request retries it;
    - no capacity: `CapacityError` at offering scope saying how far it got (`started`
      machines in `where`), so the planner tries the whole gang elsewhere;
    - not found, with a placement group set (`placement_fix` says what the option must
      name): `InvalidRequest`, a config error, most likely that group;
    - anything else: `exc` itself.
    """
    gang = request.gang or request.request_id
    try:
        delete_all()
    except ProviderError as cleanup:
        return TransientError(
            f"gang {gang}: {exc.message}; deleting its other VMs failed too ({cleanup.message}): "
            "the next launch of this request retries the cleanup"
        )
    if isinstance(exc, CapacityError):
        return CapacityError(
            f"gang {gang}: {started} of {request.nodes} {request.offering.instance_type} VMs started in "
            f"{where} before {exc.message}; deleted them",
            scope=Scope.OFFERING,
            code=exc.code,
        )
    if isinstance(exc, NotFound) and placement_fix is not None:
        return InvalidRequest(f"{exc.message}: {placement_fix} (create it, or fix the name)", code=exc.code)
    return exc


def import_extra(module: str, *, extra: str, package: str) -> ModuleType:
    """Import an SDK module lazily; `MissingExtra` names the extra when it is absent."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtra(extra, package) from None


# ---- driver settings -------------------------------------------------------------------


class DriverOptions(BaseModel):
    """Base of every driver's `options:` model: unknown keys are refused (a typo such as
    `subnet` for `subnets` would otherwise be ignored silently), values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


Options = TypeVar("Options", bound=DriverOptions)


def option_problems(model: type[DriverOptions], exc: ValidationError) -> list[tuple[tuple[str | int, ...], str]]:
    """(key path inside `options`, what is wrong) for each error; an unknown key names
    the closest known one, so a typo says what was meant."""
    out: list[tuple[tuple[str | int, ...], str]] = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        inner = _model_at(model, loc[:-1]) if err["type"] == "extra_forbidden" else None
        if inner is not None:
            known = sorted(inner.model_fields)
            close = difflib.get_close_matches(str(loc[-1]), known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            out.append((loc, f"unknown option; {hint}known: {', '.join(known) or '(none)'}"))
        else:
            out.append((loc, str(err["msg"])))
    return out


def _model_at(model: type[BaseModel], path: tuple[str | int, ...]) -> type[BaseModel] | None:
    """The model that holds the keys at `path` (through lists, tuples and optionals)."""
    current: type[BaseModel] = model
    for part in path:
        if isinstance(part, int):
            continue  # an index into a list or tuple of models
        field_info = current.model_fields.get(part)
        if field_info is None:
            return None
        found = _model_in(field_info.annotation)
        if found is None:
            return None
        current = found
    return current


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def parse_options(model: type[Options], driver: str, options: Mapping[str, Any]) -> Options:
    """Validate a pool's `options` mapping; a bad one is one `InvalidRequest` line."""
    try:
        return model.model_validate(dict(options))
    except ValidationError as exc:
        problems = "; ".join(
            f"options.{'.'.join(str(p) for p in loc)}: {msg}" for loc, msg in option_problems(model, exc)
        )
        raise InvalidRequest(f"invalid {driver} pool {problems}", scope=Scope.PROVIDER, code="InvalidConfig") from None


@runtime_checkable
class Provider(Protocol):
    name: str
    capabilities: Capabilities

    def offerings(self) -> list[Offering]:
        """Every shape this pool may launch, with prices (USD/hour)."""
        ...

    def launch(self, request: LaunchRequest) -> list[ProviderInstance]:
        """Start one instance, or `request.nodes` of them all or nothing; idempotent by
        `request.request_id` (a list: the instances, or none when the provider accepted
        the call but started nothing)."""
        ...

    def list(self, owner: str) -> list[ProviderInstance]:
        """Instances carrying this owner tag that are not terminated."""
        ...

    def terminate(self, instance_ids: Sequence[str]) -> None:
        """Stop and delete; already gone = success."""
        ...


@runtime_checkable
class InterruptionSource(Protocol):
    """Implemented by providers whose `capabilities.interruption_events` is true."""

    def interruptions(self) -> list[InterruptionEvent]:
        """Notices received since the last call (each returned once)."""
        ...


@runtime_checkable
class AcknowledgedInterruptions(Protocol):
    """An `InterruptionSource` that keeps each notice until told it was recorded.

    `interruptions()` returns notices without consuming them; the reconciler calls
    `acknowledge` only after the transaction that recorded them committed, so a notice
    is never lost to a crash or a rollback (it is delivered again instead: drains are
    idempotent)."""

    def acknowledge(self, events: Sequence[InterruptionEvent]) -> None: ...
