"""The Azure driver with the real azure-mgmt-compute/-network clients against the ARM fake."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from azure.core.pipeline import PipelineRequest
from azure.core.pipeline.policies import SansIOHTTPPolicy

from providers.azure import AzureProvider, AzureSettings
from providers.base import (
    AuthError,
    CapacityError,
    InstanceStatus,
    InvalidRequest,
    LaunchRequest,
    Offering,
    ProviderError,
    QuotaError,
    RateLimited,
    Scope,
)
from tests.fakes.azure import AzureArmFake
from tests.providers_cloud.conftest import SUBNET_ID, SUBSCRIPTION

IMAGE = "Canonical:0001-com-ubuntu-server-jammy:22_04-lts-gen2:latest"
T4_SPOT = Offering("Standard_NC4as_T4_v3", "spot", "1", 1, "T4", 4, 28000, 0.16, "eastus")
T4_REGULAR = Offering("Standard_NC4as_T4_v3", "on_demand", "2", 1, "T4", 4, 28000, 0.53, "eastus")
BOOTSTRAP = "#cloud-config\nwrite_files: [{path: /etc/autoscaler/bootstrap.json, content: '{}'}]\n"


class StaticBearer(SansIOHTTPPolicy):  # type: ignore[type-arg]
    """azure-core's bearer policy refuses plain http; the fake only needs the header."""

    def on_request(self, request: PipelineRequest) -> None:  # type: ignore[type-arg]
        request.http_request.headers["Authorization"] = "Bearer test-token"


def make_provider(fake: AzureArmFake, **options: Any) -> AzureProvider:
    settings = AzureSettings.from_options(
        {
            "subscription_id": SUBSCRIPTION,
            "resource_group": "gpu-rg",
            "subnet_id": SUBNET_ID,
            "ssh_public_key": "ssh-ed25519 AAAAC3Nza test@example",
            "base_url": fake.url,
            "sdk_retries": 0,
            **options,
        },
        region="eastus",
        image=IMAGE,
    )
    return AzureProvider(
        settings,
        [T4_SPOT, T4_REGULAR],
        credential=object(),
        client_kwargs={"authentication_policy": StaticBearer(), "polling_interval": 0},
    )


def request(request_id: str, offering: Offering = T4_SPOT, **kw: Any) -> LaunchRequest:
    return LaunchRequest(
        request_id=request_id,
        pool="azure-gpu",
        owner=kw.pop("owner", "test"),
        offering=offering,
        user_data=BOOTSTRAP,
        tags={"autoscaler-team": "vision"},
        **kw,
    )


def vm_puts(fake: AzureArmFake) -> list[Any]:
    return [r.body for r in fake.requests_matching("PUT", "/virtualMachines/")]


def test_spot_launch_body_tags_custom_data_and_nic(azure_fake: AzureArmFake) -> None:
    provider = make_provider(azure_fake)
    [inst] = provider.launch(request("Req-Z1"))

    body = vm_puts(azure_fake)[0]
    props = body["properties"]
    assert props["priority"] == "Spot"
    assert props["evictionPolicy"] == "Delete"
    assert props["billingProfile"] == {"maxPrice": -1}  # up to the on-demand price
    assert body["zones"] == ["1"]
    assert body["tags"] == {
        "autoscaler-team": "vision",
        "autoscaler-owner": "test",
        "autoscaler-pool": "azure-gpu",
        "autoscaler-request-id": "Req-Z1",
    }
    assert base64.b64decode(props["osProfile"]["customData"]).decode() == BOOTSTRAP
    assert props["storageProfile"]["osDisk"]["deleteOption"] == "Delete"
    [nic_ref] = props["networkProfile"]["networkInterfaces"]
    assert nic_ref["properties"]["deleteOption"] == "Delete"
    nic_put = azure_fake.requests_matching("PUT", "/networkInterfaces/")[0].body
    assert nic_put["properties"]["ipConfigurations"][0]["properties"]["subnet"]["id"] == SUBNET_ID
    # The create was a long-running operation, polled through the Azure-AsyncOperation URL.
    assert azure_fake.requests_matching("GET", "/operations/")
    assert inst.status == InstanceStatus.RUNNING and inst.capacity_type == "spot" and inst.zone == "1"


def test_regular_launch_and_the_pool_s_spot_price(azure_fake: AzureArmFake) -> None:
    provider = make_provider(azure_fake, max_price=0.2)
    provider.launch(request("reg-1", T4_REGULAR))
    provider.launch(request("bid-1"))
    regular, bid = (b["properties"] for b in vm_puts(azure_fake))
    assert regular["priority"] == "Regular"
    assert "evictionPolicy" not in regular and "billingProfile" not in regular
    assert bid["billingProfile"] == {"maxPrice": 0.2}


def test_list_by_owner_tag(azure_fake: AzureArmFake) -> None:
    provider = make_provider(azure_fake)
    provider.launch(request("l-1"))
    provider.launch(request("l-2", T4_REGULAR))
    provider.launch(request("l-3", owner="another-deployment"))
    listed = sorted(provider.list("test"), key=lambda i: i.request_id or "")
    assert [(i.request_id, i.capacity_type, i.zone, i.pool) for i in listed] == [
        ("l-1", "spot", "1", "azure-gpu"),
        ("l-2", "on_demand", "2", "azure-gpu"),
    ]
    assert all(i.instance_type == "Standard_NC4as_T4_v3" for i in listed)


def test_same_request_id_is_idempotent(azure_fake: AzureArmFake) -> None:
    provider = make_provider(azure_fake)
    first = provider.launch(request("idem-1"))
    again = provider.launch(request("idem-1"))
    assert [i.instance_id for i in first] == [i.instance_id for i in again]
    assert len(azure_fake.vms) == 1 and len(azure_fake.nics) == 1
    assert len(vm_puts(azure_fake)) == 1  # the retry found the VM by name


def test_terminate_deletes_vm_with_disk_and_nic_and_gone_is_success(azure_fake: AzureArmFake) -> None:
    provider = make_provider(azure_fake)
    ids = [i.instance_id for i in provider.launch(request("del-1")) + provider.launch(request("del-2"))]
    provider.terminate(ids)
    assert provider.list("test") == []
    assert azure_fake.vms == {} and azure_fake.nics == {} and azure_fake.disks == set()
    provider.terminate(ids)  # 204 for a missing VM: success


@pytest.mark.parametrize(
    ("code", "message", "status", "sync", "expected", "scope"),
    [
        ("AllocationFailed", "Allocation failed.", 200, False, CapacityError, Scope.OFFERING),
        ("OverconstrainedAllocationRequest", "Allocation failed.", 200, False, CapacityError, Scope.OFFERING),
        ("ZonalAllocationFailed", "Allocation failed in zone 1.", 200, False, CapacityError, Scope.OFFERING),
        (
            "SkuNotAvailable",
            "The requested size is not available in location 'eastus'.",
            409,
            True,
            CapacityError,
            Scope.OFFERING,
        ),
        (
            "OperationNotAllowed",
            "Operation could not be completed as it results in exceeding approved standardNCASv3_T4Family Cores quota.",
            409,
            True,
            QuotaError,
            Scope.REGION,
        ),
        ("QuotaExceeded", "Spot cores quota exceeded.", 409, True, QuotaError, Scope.REGION),
        (
            "AuthorizationFailed",
            "The client does not have authorization.",
            403,
            True,
            AuthError,
            Scope.PROVIDER,
        ),
        ("InvalidParameter", "Bad value.", 400, True, InvalidRequest, Scope.OFFERING),
    ],
)
def test_error_codes_map_to_typed_errors_and_leave_nothing_behind(
    azure_fake: AzureArmFake,
    code: str,
    message: str,
    status: int,
    sync: bool,
    expected: type[ProviderError],
    scope: Scope,
) -> None:
    provider = make_provider(azure_fake)
    # Asynchronous allocation failures leave the Failed VM resource behind, as Azure does.
    azure_fake.fail_create(code, message, status=status, sync=sync, leave_behind=not sync)
    with pytest.raises(ProviderError) as info:
        provider.launch(request(f"err-{code.lower()}"))
    assert type(info.value) is expected and info.value.scope == scope and info.value.code == code
    assert azure_fake.vms == {} and azure_fake.nics == {} and azure_fake.disks == set()


def test_operation_not_allowed_without_quota_text_is_not_quota(azure_fake: AzureArmFake) -> None:
    provider = make_provider(azure_fake)
    azure_fake.fail_create("OperationNotAllowed", "Spot is not supported for this image.", sync=True)
    with pytest.raises(InvalidRequest):
        provider.launch(request("ona-1"))


def test_throttling_honours_retry_after(azure_fake: AzureArmFake) -> None:
    provider = make_provider(azure_fake)
    azure_fake.fail_create("TooManyRequests", "Throttled.", status=429, sync=True, retry_after=37)
    with pytest.raises(RateLimited) as info:
        provider.launch(request("throttle-1"))
    assert info.value.retry_after_s == 37


def test_failed_vm_left_behind_is_deleted_then_relaunch_works(azure_fake: AzureArmFake) -> None:
    provider = make_provider(azure_fake)
    azure_fake.fail_create("AllocationFailed", leave_behind=True)
    with pytest.raises(CapacityError):
        provider.launch(request("again-1"))
    assert len(azure_fake.requests_matching("DELETE", "/virtualMachines/")) == 1
    [inst] = provider.launch(request("again-1"))
    assert inst.status == InstanceStatus.RUNNING


def test_bad_pool_options_are_one_line_errors() -> None:
    with pytest.raises(InvalidRequest, match=r"invalid Azure pool options.resource_group: Field required") as info:
        AzureSettings.from_options(
            {"subscription_id": "s", "subnet_id": SUBNET_ID, "ssh_public_key": "k"},
            region="eastus",
            image=IMAGE,
        )
    assert "\n" not in info.value.message
    with pytest.raises(InvalidRequest, match=r"options.subnet_id: Value error, must be a full resource id"):
        AzureSettings.from_options(
            {"subscription_id": "s", "resource_group": "rg", "subnet_id": "workers", "ssh_public_key": "k"},
            region="eastus",
            image=IMAGE,
        )


def test_bad_image_is_refused_before_any_call(azure_fake: AzureArmFake) -> None:
    provider = make_provider(azure_fake)
    with pytest.raises(InvalidRequest, match="publisher:offer:sku:version"):
        provider.launch(LaunchRequest("img-1", "azure-gpu", "test", T4_SPOT, image="ubuntu"))
