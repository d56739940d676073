"""The GCP driver with the real google-cloud-compute client against the local REST fake."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from google.auth.credentials import AnonymousCredentials

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
from providers.gcp import GcpProvider, GcpSettings
from tests.fakes.gcp import GcpComputeFake

ZONES = ["us-central1-a", "us-central1-b"]
IMAGE = "projects/debian-cloud/global/images/family/debian-12"
T4_SPOT = Offering("n1-standard-8", "spot", "us-central1-a", 1, "nvidia-tesla-t4", 8, 30000, 0.15, "us-central1")
A100_OD = Offering(
    "a2-highgpu-1g", "on_demand", "us-central1-b", 1, "nvidia-tesla-a100", 12, 85000, 3.67, "us-central1"
)
BOOTSTRAP = "#cloud-config\nwrite_files: [{path: /etc/autoscaler/bootstrap.json, content: '{}'}]\n"


def make_provider(fake: GcpComputeFake, **options: object) -> GcpProvider:
    settings = GcpSettings.from_options(
        {"project": "proj-1", "api_endpoint": fake.url, **options},
        region="us-central1",
        zones=ZONES,
        image=IMAGE,
    )
    return GcpProvider(settings, [T4_SPOT, A100_OD], credentials=AnonymousCredentials())  # type: ignore[no-untyped-call]


def request(request_id: str, offering: Offering = T4_SPOT, owner: str = "test") -> LaunchRequest:
    return LaunchRequest(
        request_id=request_id,
        pool="gcp-gpu",
        owner=owner,
        offering=offering,
        user_data=BOOTSTRAP,
        tags={"autoscaler-team": "Vision.Research"},
    )


def inserts(fake: GcpComputeFake) -> list[Any]:
    return [r.body for r in fake.requests_matching("POST", "/instances") if r.body]


def test_spot_launch_sends_spot_scheduling_gpus_labels_and_bootstrap(gcp_fake: GcpComputeFake) -> None:
    provider = make_provider(gcp_fake)
    [inst] = provider.launch(request("Req-A1"))

    post = gcp_fake.requests_matching("POST", "/zones/us-central1-a/instances")[0]
    assert uuid.UUID(post.query["requestId"])  # GCP requires a UUID
    body = post.body
    assert body["scheduling"] == {
        "provisioningModel": "SPOT",
        "instanceTerminationAction": "DELETE",
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": False,
    }
    assert body["guestAccelerators"] == [
        {"acceleratorCount": 1, "acceleratorType": "zones/us-central1-a/acceleratorTypes/nvidia-tesla-t4"}
    ]
    assert body["labels"] == {
        "autoscaler-owner": "test",
        "autoscaler-pool": "gcp-gpu",
        "autoscaler-request-id": "req-a1",
        "autoscaler-team": "vision_research",  # sanitised to GCP's label alphabet
    }
    meta = {i["key"]: i["value"] for i in body["metadata"]["items"]}
    assert meta["user-data"] == BOOTSTRAP
    assert meta["autoscaler-request-id"] == "Req-A1"
    assert body["machineType"] == "zones/us-central1-a/machineTypes/n1-standard-8"
    # The operation was waited on through the same endpoint (not the public one).
    assert gcp_fake.requests_matching("POST", "/operations/")
    assert inst.instance_id.startswith("us-central1-a/") and inst.capacity_type == "spot"


def test_on_demand_launch_is_standard_and_built_in_gpus_need_no_accelerator(gcp_fake: GcpComputeFake) -> None:
    provider = make_provider(gcp_fake)
    provider.launch(request("od-1", A100_OD))
    body = inserts(gcp_fake)[0]
    assert body["scheduling"]["provisioningModel"] == "STANDARD"
    assert "instanceTerminationAction" not in body["scheduling"]
    assert body["scheduling"]["onHostMaintenance"] == "TERMINATE"  # GPUs cannot live-migrate
    assert "guestAccelerators" not in body


def test_list_is_aggregated_across_zones_and_filtered_by_owner(gcp_fake: GcpComputeFake) -> None:
    provider = make_provider(gcp_fake)
    provider.launch(request("a-1"))
    provider.launch(request("b-1", A100_OD))
    provider.launch(request("other-1", owner="someone-else"))

    listed = sorted(provider.list("test"), key=lambda i: i.instance_id)
    assert [(i.zone, i.request_id, i.capacity_type, i.status) for i in listed] == [
        ("us-central1-a", "a-1", "spot", InstanceStatus.RUNNING),
        ("us-central1-b", "b-1", "on_demand", InstanceStatus.RUNNING),
    ]
    assert all(i.pool == "gcp-gpu" and i.private_ip for i in listed)
    assert listed[1].instance_type == "a2-highgpu-1g"
    assert gcp_fake.requests_matching("GET", "/aggregated/instances")[0].query["filter"] == (
        'labels.autoscaler-owner = "test"'
    )


def test_same_request_id_is_idempotent(gcp_fake: GcpComputeFake) -> None:
    provider = make_provider(gcp_fake)
    first = provider.launch(request("retry-1"))
    again = provider.launch(request("retry-1"))
    assert [i.instance_id for i in first] == [i.instance_id for i in again]
    assert len(gcp_fake.live()) == 1
    request_ids = [r.query["requestId"] for r in gcp_fake.requests_matching("POST", "/instances")]
    assert len(request_ids) == 2 and request_ids[0] == request_ids[1]

    # After GCP forgot the requestId (it keeps them about an hour), the deterministic
    # name still prevents a duplicate: `alreadyExists` is success.
    gcp_fake.by_request_id.clear()
    assert [i.instance_id for i in provider.launch(request("retry-1"))] == [i.instance_id for i in first]
    assert len(gcp_fake.live()) == 1


def test_terminate_deletes_and_a_gone_instance_is_success(gcp_fake: GcpComputeFake) -> None:
    provider = make_provider(gcp_fake)
    ids = [i.instance_id for i in provider.launch(request("del-1")) + provider.launch(request("del-2"))]
    provider.terminate(ids)
    assert provider.list("test") == []
    provider.terminate(ids)  # 404 notFound: already gone
    assert len(gcp_fake.requests_matching("DELETE", "/instances/")) == 4


def test_operation_is_polled_until_done(gcp_fake: GcpComputeFake) -> None:
    gcp_fake.operation_polls = 3
    provider = make_provider(gcp_fake)
    provider.launch(request("poll-1"))
    assert len(gcp_fake.requests_matching("POST", "/wait")) == 3


@pytest.mark.parametrize(
    ("code", "sync", "status", "metric", "expected", "scope"),
    [
        ("ZONE_RESOURCE_POOL_EXHAUSTED", False, 503, "", CapacityError, Scope.OFFERING),
        ("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", False, 503, "", CapacityError, Scope.OFFERING),
        ("insufficientCapacity", True, 503, "", CapacityError, Scope.OFFERING),
        ("QUOTA_EXCEEDED", False, 403, "GPUS_ALL_REGIONS", QuotaError, Scope.PROVIDER),
        ("QUOTA_EXCEEDED", False, 403, "NVIDIA_T4_GPUS", QuotaError, Scope.REGION),
        ("quotaExceeded", True, 403, "", QuotaError, Scope.REGION),
        ("RESOURCE_OPERATION_RATE_EXCEEDED", False, 503, "", RateLimited, Scope.PROVIDER),
        ("rateLimitExceeded", True, 429, "", RateLimited, Scope.PROVIDER),
        ("forbidden", True, 403, "", AuthError, Scope.PROVIDER),
        ("invalid", True, 400, "", InvalidRequest, Scope.OFFERING),
    ],
)
def test_error_codes_map_to_typed_errors_with_scope(
    gcp_fake: GcpComputeFake,
    code: str,
    sync: bool,
    status: int,
    metric: str,
    expected: type[ProviderError],
    scope: Scope,
) -> None:
    provider = make_provider(gcp_fake)
    gcp_fake.fail_insert(code, f"{code}: {metric or 'details'}", http_status=status, sync=sync, quota_metric=metric)
    with pytest.raises(ProviderError) as info:
        provider.launch(request(f"err-{code.lower()}"))
    assert type(info.value) is expected
    assert info.value.scope == scope
    assert code in info.value.message and "us-central1-a" in info.value.message
    assert provider.list("test") == []  # a failed create leaves nothing behind


def test_bad_pool_options_are_one_line_errors() -> None:
    with pytest.raises(InvalidRequest, match=r"invalid GCP pool options.project: Field required") as info:
        GcpSettings.from_options({}, region="us-central1", zones=ZONES, image=IMAGE)
    assert "\n" not in info.value.message
    with pytest.raises(InvalidRequest, match=r"options.projet: unknown option; did you mean 'project'\?"):
        GcpSettings.from_options({"projet": "x"}, region="us-central1", zones=ZONES, image=IMAGE)
    with pytest.raises(InvalidRequest, match=r"options.spot_termination_action: Input should be 'DELETE' or 'STOP'"):
        GcpSettings.from_options(
            {"project": "p", "spot_termination_action": "hibernate"}, region="r", zones=ZONES, image=IMAGE
        )
    assert (
        GcpSettings.from_options(
            {"project": "p", "spot_termination_action": "stop"}, region="r", zones=ZONES, image=IMAGE
        ).spot_termination_action
        == "STOP"
    )
    with pytest.raises(InvalidRequest, match="at least one zone"):
        GcpSettings.from_options({"project": "p"}, region="us-central1", zones=[], image=IMAGE)


def test_missing_image_is_a_clear_error(gcp_fake: GcpComputeFake) -> None:
    settings = GcpSettings.from_options(
        {"project": "p", "api_endpoint": gcp_fake.url}, region="r", zones=ZONES, image=None
    )
    provider = GcpProvider(settings, [T4_SPOT], credentials=AnonymousCredentials())  # type: ignore[no-untyped-call]
    with pytest.raises(InvalidRequest, match="has no image"):
        provider.launch(request("no-image"))
    assert gcp_fake.requests == []
