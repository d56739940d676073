"""The provider contract (providers/base.py), checked the same way on all seven drivers.

Each driver runs against the backend its own suite uses: the fake in memory, the local
provider's real processes, AWS on the moto server, GCP and Azure on their REST fakes
(tests/fakes), Slurm on the test cluster, static with declared machines. The promises:

- a launch is idempotent by request id (a second call starts nothing and answers the
  same instances);
- terminating an instance that is gone (already terminated, or never existed) succeeds;
- `list(owner)` answers that owner's instances and nobody else's;
- a refused launch raises a typed `ProviderError`, never anything else.

A static pool launches nothing: its contract is that launch is refused with a typed
error every time and terminate never touches a machine.
"""

from __future__ import annotations

import errno
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from providers.base import (
    TAG_GANG,
    AuthError,
    CapacityError,
    InstanceStatus,
    InvalidRequest,
    LaunchRequest,
    Offering,
    Provider,
    ProviderError,
    ProviderInstance,
    RateLimited,
    Scope,
    TransientError,
)
from providers.bootstrap import BootstrapSpec, render_user_data
from providers.fake import FakeProvider
from providers.local import LocalProvider, default_offering
from providers.static import StaticProvider, StaticSettings
from tests.fakes.aws import MotoEC2, unique_owner

DRIVERS = ["fake", "local", "aws", "gcp", "azure", "slurm", "static"]
POOL = "contract"
# A stand-in agent for the local and Slurm drivers: it only has to stay alive.
SLEEPER = "import time; time.sleep(300)"


def user_data(provider: str) -> str:
    spec = BootstrapSpec(server_url="http://127.0.0.1:9", pool=POOL, provider=provider, join_token="asj_" + "c" * 43)
    return render_user_data(spec)


@dataclass
class Backend:
    """One driver on its test backend, and how to make it refuse a launch."""

    provider: Provider
    offering: Offering
    # Arms the backend so the next launch of `request(...)` is refused; returns the
    # error type the driver must raise for it.
    refuse_next: Callable[[], type[ProviderError]]
    # An instance id in the driver's own format that names no instance.
    never_existed: str
    launches: bool = True
    cleanup: list[Callable[[], None]] = field(default_factory=list)
    # The backend's fault knob (moto server, REST fake), for the gang cases.
    knob: Any = None

    @property
    def kind(self) -> str:
        """The bootstrap's provider name (the fake stands in for a local machine)."""
        name = self.provider.name.split(":")[0]
        return "local" if name == "fake" else name

    def request(self, request_id: str, owner: str, offering: Offering | None = None) -> LaunchRequest:
        return LaunchRequest(
            request_id=request_id,
            pool=POOL,
            owner=owner,
            offering=offering or self.offering,
            user_data=user_data(self.kind),
            tags={"autoscaler-team": "vision"},
        )


# ---- one builder per driver ------------------------------------------------------------


def _fake(request: pytest.FixtureRequest) -> Backend:
    offering = Offering("fake.1gpu", "spot", "zone-a", 1, "Fake", 4, 16384, 0.5)
    fake = FakeProvider([offering])

    def refuse() -> type[ProviderError]:
        fake.set_capacity(offering.key, 0)
        return CapacityError

    return Backend(fake, offering, refuse, never_existed="fake-999999")


def _local(request: pytest.FixtureRequest) -> Backend:
    home: Path = request.getfixturevalue("tmp_path")
    local = LocalProvider(
        [], pool=POOL, home=home, command=lambda boot: [sys.executable, "-c", SLEEPER, str(boot)], stop_grace_s=2
    )
    backend = Backend(local, default_offering(None), lambda: InvalidRequest, never_existed="local-never-existed")
    # The local driver has no capacity to run out of: what it refuses is a launch
    # without a bootstrap (no join token), so that is the refusal checked.
    backend.request = _without_user_data(backend.request)  # type: ignore[method-assign]
    backend.cleanup.append(lambda: local.terminate([r.instance_id for r in local._records()]))
    return backend


def _without_user_data(make: Callable[..., LaunchRequest]) -> Callable[..., LaunchRequest]:
    """Requests as usual, except the one after `refuse_next` (marked by its id) has none."""

    def request(request_id: str, owner: str, offering: Offering | None = None) -> LaunchRequest:
        made = make(request_id, owner, offering)
        if request_id.startswith("refused"):
            return LaunchRequest(made.request_id, made.pool, made.owner, made.offering, tags=made.tags)
        return made

    return request


def _aws(request: pytest.FixtureRequest) -> Backend:
    from tests.providers.test_aws import G5_SPOT, make

    moto: MotoEC2 = request.getfixturevalue("moto_ec2")
    aws = make(moto)

    def refuse() -> type[ProviderError]:
        moto.arm("RunInstances", "InsufficientInstanceCapacity", times=None)
        moto.arm("CreateFleet", "InsufficientInstanceCapacity", times=None, in_body=True)
        return CapacityError

    return Backend(aws, G5_SPOT, refuse, never_existed="i-0123456789abcdef0")


def _gcp(request: pytest.FixtureRequest) -> Backend:
    from tests.providers_cloud.test_gcp import T4_SPOT, make_provider

    fake = request.getfixturevalue("gcp_fake")
    gcp = make_provider(fake)

    def refuse() -> type[ProviderError]:
        fake.fail_insert("ZONE_RESOURCE_POOL_EXHAUSTED", times=10)
        return CapacityError

    return Backend(gcp, T4_SPOT, refuse, never_existed="us-central1-a/as-never-existed")


def _azure(request: pytest.FixtureRequest) -> Backend:
    from tests.providers_cloud.test_azure import T4_SPOT, make_provider

    fake = request.getfixturevalue("azure_fake")
    azure = make_provider(fake)

    def refuse() -> type[ProviderError]:
        fake.fail_create("AllocationFailed", "Allocation failed.", status=200, times=10)
        return CapacityError

    return Backend(azure, T4_SPOT, refuse, never_existed="as-never-existed")


def _slurm(request: pytest.FixtureRequest) -> Backend:
    from providers.slurm import SlurmProvider, SlurmSettings

    cluster = request.getfixturevalue("slurm_cluster")
    home: Path = request.getfixturevalue("tmp_path")
    one = Offering("slurm.1gpu", "on_demand", None, 1, "Simulated", 1, 500, 0.0)
    settings = SlurmSettings.from_options(
        {"slurm_conf": str(cluster.conf), "agent_command": [sys.executable, "-c", SLEEPER]},
        home=home,
        pool=POOL,
        boot_timeout_s=600,
    )
    slurm = SlurmProvider(settings, [one])
    backend = Backend(slurm, one, lambda: CapacityError, never_existed="as-never-existed-0")
    # The test cluster has a few simulated GPUs: a job asking for 64 cannot be placed,
    # which is sbatch's capacity refusal.
    huge = Offering("slurm.64gpu", "on_demand", None, 64, "Simulated", 1, 500, 0.0)
    plain = backend.request

    def slurm_request(request_id: str, owner: str, offering: Offering | None = None) -> LaunchRequest:
        return plain(request_id, owner, huge if request_id.startswith("refused") else offering)

    backend.request = slurm_request  # type: ignore[method-assign]
    return backend


def _static(request: pytest.FixtureRequest) -> Backend:
    offering = Offering("static.2gpu", "on_demand", None, 2, "A100", 32, 256000, 0.0)
    settings = StaticSettings.from_options({"machines": [{"name": "rack1-n1", "gpus": 2}, "rack1-n2"]})
    static = StaticProvider(settings, [offering], pool=POOL, owner=OWNER_STATIC)
    return Backend(static, offering, lambda: InvalidRequest, never_existed="rack9-n9", launches=False)


OWNER_STATIC = "static-deployment"
BUILDERS: dict[str, Callable[[pytest.FixtureRequest], Backend]] = {
    "fake": _fake,
    "local": _local,
    "aws": _aws,
    "gcp": _gcp,
    "azure": _azure,
    "slurm": _slurm,
    "static": _static,
}


@pytest.fixture(params=DRIVERS)
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    built = BUILDERS[request.param](request)
    yield built
    for step in built.cleanup:
        step()


@pytest.fixture
def owner(backend: Backend) -> str:
    return OWNER_STATIC if not backend.launches else unique_owner("contract")


def launched(backend: Backend, request: LaunchRequest) -> list[ProviderInstance]:
    instances = backend.provider.launch(request)
    backend.cleanup.append(lambda: backend.provider.terminate([i.instance_id for i in instances]))
    return instances


def listed(backend: Backend, owner: str, *, settle_s: float = 10.0, want: int | None = None) -> list[ProviderInstance]:
    """`list(owner)`, waited on up to `settle_s` until it shows `want` instances: the
    contract allows a listing to lag a launch or a terminate."""
    deadline = time.monotonic() + settle_s
    while True:
        live = [i for i in backend.provider.list(owner) if i.status not in (InstanceStatus.STOPPING,)]
        if want is None or len(live) == want or time.monotonic() > deadline:
            return live
        time.sleep(0.2)


# ---- the promises ------------------------------------------------------------------------


def test_every_driver_is_a_provider(backend: Backend) -> None:
    assert isinstance(backend.provider, Provider)
    offered = backend.provider.offerings()
    assert offered and all(isinstance(o, Offering) for o in offered)
    assert backend.offering.instance_type in {o.instance_type for o in offered}


def test_launch_is_idempotent_by_request_id(backend: Backend, owner: str) -> None:
    if not backend.launches:
        for _ in range(2):
            with pytest.raises(InvalidRequest):
                backend.provider.launch(backend.request("idem-1", owner))
        assert len(listed(backend, owner)) == 2, "a refused launch changes nothing"
        return
    first = launched(backend, backend.request("idem-1", owner))
    again = launched(backend, backend.request("idem-1", owner))
    assert len(first) == 1
    assert [i.instance_id for i in again] == [i.instance_id for i in first]
    [only] = listed(backend, owner, want=1)
    assert (only.instance_id, only.request_id, only.pool) == (first[0].instance_id, "idem-1", POOL)


def test_terminating_what_is_gone_succeeds(backend: Backend, owner: str) -> None:
    backend.provider.terminate([backend.never_existed])
    backend.provider.terminate([])
    if not backend.launches:
        backend.provider.terminate(["rack1-n1"])
        assert {i.instance_id for i in listed(backend, owner)} == {"rack1-n1", "rack1-n2"}, "never powered off"
        return
    [inst] = launched(backend, backend.request("gone-1", owner))
    listed(backend, owner, want=1)
    backend.provider.terminate([inst.instance_id])
    assert listed(backend, owner, want=0) == [], "a terminated instance leaves the listing"
    backend.provider.terminate([inst.instance_id])  # already gone: success
    backend.provider.terminate([inst.instance_id, backend.never_existed])


def test_list_answers_the_owner_s_instances_only(backend: Backend, owner: str) -> None:
    other = unique_owner("other")
    if backend.launches:
        [mine] = launched(backend, backend.request("own-1", owner))
        [theirs] = launched(backend, backend.request("own-2", other))
        assert mine.instance_id != theirs.instance_id
        assert [i.instance_id for i in listed(backend, owner, want=1)] == [mine.instance_id]
        assert [i.instance_id for i in listed(backend, other, want=1)] == [theirs.instance_id]
    else:
        assert listed(backend, other) == []
    for inst in listed(backend, owner):
        assert inst.pool == POOL and inst.tags.get("autoscaler-owner") == owner
    assert listed(backend, unique_owner("nobody")) == []


def test_a_refused_launch_raises_a_typed_error(backend: Backend, owner: str) -> None:
    expected = backend.refuse_next()
    with pytest.raises(ProviderError) as caught:
        launched(backend, backend.request("refused-1", owner))
    assert isinstance(caught.value, expected), f"{type(caught.value).__name__}: {caught.value}"
    assert caught.value.message, "a typed error says what was wrong"
    assert len(listed(backend, owner)) == (0 if backend.launches else 2), "a refused launch starts nothing"


# ---- one error shape, one missing-SDK path -----------------------------------------------


def _mappers() -> dict[str, Callable[[str, str, int | None], ProviderError]]:
    from providers.aws.errors import map_error as aws
    from providers.azure.errors import map_error as azure
    from providers.gcp.errors import map_error as gcp
    from providers.slurm.driver import map_error as slurm

    return {"aws": aws, "gcp": gcp, "azure": azure, "slurm": slurm}


@pytest.mark.parametrize(
    ("driver", "code", "message", "status", "expected"),
    [
        ("aws", "InsufficientInstanceCapacity", "no g5", 500, CapacityError),
        ("gcp", "ZONE_RESOURCE_POOL_EXHAUSTED", "no T4", 503, CapacityError),
        ("azure", "AllocationFailed", "no NC4", 200, CapacityError),
        ("slurm", "sbatch", "Requested node configuration is not available", None, CapacityError),
        ("aws", "SomethingNew", "throttled", 429, RateLimited),
        ("gcp", "somethingNew", "throttled", 429, RateLimited),
        ("azure", "SomethingNew", "throttled", 429, RateLimited),
        ("aws", "SomethingNew", "down", 503, TransientError),
        ("gcp", "somethingNew", "down", 503, TransientError),
        ("azure", "SomethingNew", "down", 503, TransientError),
        ("slurm", "squeue", "Unable to contact slurm controller", None, TransientError),
        ("gcp", "forbidden", "no", 403, AuthError),
        ("azure", "SomethingNew", "no", 403, AuthError),
        ("slurm", "sbatch", "something nobody has seen", None, InvalidRequest),
    ],
)
def test_every_driver_maps_errors_with_one_shape(
    driver: str, code: str, message: str, status: int | None, expected: type[ProviderError]
) -> None:
    error = _mappers()[driver](code, message, status)
    assert type(error) is expected, f"{driver}: {type(error).__name__}: {error.message}"
    assert message.split()[0] in error.message, "the backend's words reach the user"


@pytest.mark.parametrize(
    ("driver", "module", "options"),
    [
        ("aws", "boto3", {}),
        ("gcp", "google.cloud.compute_v1", {"project": "p"}),
        (
            "azure",
            "azure.mgmt.compute",
            {
                "subscription_id": "s",
                "resource_group": "rg",
                "ssh_public_key": "k",
                "subnet_id": "/subscriptions/s/resourceGroups/rg/providers/"
                "Microsoft.Network/virtualNetworks/v/subnets/w",
            },
        ),
    ],
)
def test_a_missing_sdk_is_one_missing_extra_line(
    driver: str, module: str, options: dict[str, object], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autoscaler.config import PoolConfig
    from autoscaler.errors import MissingExtra
    from autoscaler.provisioning import build_provider

    monkeypatch.setitem(sys.modules, module, None)  # what an install without the extra sees
    pool = PoolConfig(name="p", provider=driver, region="r1", zones=["r1-a"], options=options)  # type: ignore[arg-type]
    with pytest.raises(MissingExtra) as caught:
        build_provider(pool, deployment="d", home=tmp_path)
    assert f"pip install 'gpu-autoscaler[{driver}]'" in str(caught.value)
    assert "\n" not in str(caught.value)


# ---- gangs (LaunchRequest.nodes > 1) -------------------------------------------------------
#
# Every driver this suite knows is listed here, none is skipped silently:
# - aws, gcp, azure: launch a 2-node gang;
# - slurm: its test cluster has one node, so a 1-node gang is launched (one sbatch with
#   an srun step) and a 2-node gang must be refused with InvalidRequest;
# - static: launches nothing, a gang is refused with InvalidRequest;
# - fake: launches a 2-node gang (all or nothing against its capacity knob);
# - local: launches a 2-node gang (k agent processes); one that cannot start stops the
#   others.
# A driver without a gang case goes in NOT_YET (none today), and
# `test_every_driver_has_a_gang_case` fails if a driver is in neither.
GANG_WIDTH = {"fake": 2, "local": 2, "aws": 2, "gcp": 2, "azure": 2, "slurm": 1, "static": 0}
NOT_YET: set[str] = set()


def _refuse_one_node(name: str, backend: Backend) -> type[ProviderError]:
    """Arm the backend so the gang's second node cannot start; the error the driver must raise."""
    if name == "aws":
        # EC2 is all or nothing (MinCount = N): the one call fails.
        backend.knob.arm("RunInstances", "InsufficientInstanceCapacity", times=None)
        return CapacityError
    if name == "gcp":
        backend.knob.fail_insert("ZONE_RESOURCE_POOL_EXHAUSTED", after=1)
        return CapacityError
    if name == "azure":
        backend.knob.fail_create("AllocationFailed", "Allocation failed.", after=1)
        return CapacityError
    if name == "fake":
        assert isinstance(backend.provider, FakeProvider)
        backend.provider.set_capacity(backend.offering.key, 1)  # room for one of the two
        return CapacityError
    if name == "local":
        assert isinstance(backend.provider, LocalProvider)
        command, started = backend.provider._command, []

        def second_fails(boot: Path) -> Sequence[str]:
            started.append(boot)
            if len(started) == 2:
                raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
            return command(boot)

        backend.provider._command = second_fails
        return CapacityError
    return InvalidRequest  # slurm (wider than its one-node partition), static


@pytest.fixture(params=sorted(GANG_WIDTH))
def gang_backend(request: pytest.FixtureRequest) -> Iterator[tuple[str, Backend]]:
    name = request.param
    built = BUILDERS[name](request)
    # The backends' fault knobs, for `_refuse_one_node`.
    fixture = {"aws": "moto_ec2", "gcp": "gcp_fake", "azure": "azure_fake"}.get(name)
    if fixture is not None:
        built.knob = request.getfixturevalue(fixture)
    yield name, built
    for step in built.cleanup:
        step()


def gang_request(backend: Backend, request_id: str, owner: str, nodes: int) -> LaunchRequest:
    return replace(backend.request(request_id, owner), nodes=nodes, gang=f"gang-{request_id}")


def test_every_driver_has_a_gang_case() -> None:
    assert set(GANG_WIDTH) | NOT_YET == set(DRIVERS) and not set(GANG_WIDTH) & NOT_YET


def test_max_gang_nodes_is_a_limit_or_none(gang_backend: tuple[str, Backend]) -> None:
    _, backend = gang_backend
    limit = backend.provider.capabilities.max_gang_nodes
    assert limit is None or limit >= 1


def test_a_gang_is_whole_in_one_zone_tagged_and_idempotent(gang_backend: tuple[str, Backend]) -> None:
    name, backend = gang_backend
    owner = OWNER_STATIC if not backend.launches else unique_owner("gang")
    width = GANG_WIDTH[name]
    if width == 0:
        with pytest.raises(InvalidRequest):
            backend.provider.launch(gang_request(backend, "gang-1", owner, 2))
        return
    first = launched(backend, gang_request(backend, "gang-1", owner, width))
    assert len(first) == width and len({i.instance_id for i in first}) == width
    again = launched(backend, gang_request(backend, "gang-1", owner, width))
    assert sorted(i.instance_id for i in again) == sorted(i.instance_id for i in first), "idempotent"
    live = listed(backend, owner, want=width)
    assert sorted(i.instance_id for i in live) == sorted(i.instance_id for i in first)
    assert {i.request_id for i in live} == {"gang-1"}
    assert len({i.zone for i in live}) == 1, "one zone"
    for inst in [*first, *live]:
        # GCP labels lower-case values; the gang id here is lower-case already.
        assert inst.tags.get(TAG_GANG) == "gang-gang-1", f"{inst.instance_id}: {dict(inst.tags)}"


def test_a_gang_that_cannot_start_whole_leaves_nothing(gang_backend: tuple[str, Backend]) -> None:
    name, backend = gang_backend
    owner = OWNER_STATIC if not backend.launches else unique_owner("gang")
    expected = _refuse_one_node(name, backend)
    with pytest.raises(ProviderError) as caught:
        launched(backend, gang_request(backend, "gang-part", owner, 2))
    assert isinstance(caught.value, expected), f"{type(caught.value).__name__}: {caught.value}"
    if expected is CapacityError:
        assert caught.value.scope is Scope.OFFERING, "the planner retries the whole gang elsewhere"
    assert caught.value.message
    left = listed(backend, owner, want=0 if backend.launches else 2)
    assert len(left) == (0 if backend.launches else 2), "never a half gang billing"
