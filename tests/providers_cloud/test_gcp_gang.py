"""GCP gangs against the Compute REST fake: N inserts in one zone, a compact placement
policy on each VM, rollback when one of them fails."""

from __future__ import annotations

import dataclasses

import pytest

from providers.base import CapacityError, InvalidRequest, LaunchRequest, QuotaError, Scope
from providers.gcp.labels import label_value
from tests.fakes.gcp import GcpComputeFake
from tests.providers_cloud.test_gcp import A100_OD, inserts, make_provider, request


def gang(rid: str, nodes: int, gang_id: str = "gang-7") -> LaunchRequest:
    return dataclasses.replace(request(rid, A100_OD), nodes=nodes, gang=gang_id)


def test_a_gang_is_n_vms_in_one_zone_with_the_gang_label(gcp_fake: GcpComputeFake) -> None:
    gcp = make_provider(gcp_fake)
    out = gcp.launch(gang("req-g1", 3))
    assert len(out) == 3 and len({i.instance_id for i in out}) == 3
    assert {i.zone for i in out} == {"us-central1-b"}
    assert all(i.request_id == "req-g1" and i.tags["autoscaler-gang"] == "gang-7" for i in out)
    live = gcp_fake.live()
    assert len(live) == 3
    assert {v["labels"]["autoscaler-gang"] for v in live} == {label_value("gang-7")}
    assert all("resourcePolicies" not in v for v in live), "no policy unless the pool names one"
    listed = gcp.list("test")
    assert sorted(i.instance_id for i in listed) == sorted(i.instance_id for i in out)
    assert {i.request_id for i in listed} == {"req-g1"}
    # Idempotent: the same request again creates nothing new.
    again = gcp.launch(gang("req-g1", 3))
    assert sorted(i.instance_id for i in again) == sorted(i.instance_id for i in out)
    assert len(gcp_fake.live()) == 3


def test_the_compact_placement_policy_goes_on_every_gang_vm(gcp_fake: GcpComputeFake) -> None:
    path = gcp_fake.add_resource_policy("proj-1", "us-central1", "compact-1")
    gcp = make_provider(gcp_fake, placement_policy="compact-1")
    gcp.launch(gang("req-pp", 2))
    assert [b["resourcePolicies"] for b in inserts(gcp_fake)] == [[path], [path]]
    # A single VM does not join it.
    gcp.launch(request("req-single", A100_OD))
    assert "resourcePolicies" not in inserts(gcp_fake)[-1]


def test_an_unknown_policy_is_a_config_error_and_leaves_nothing(gcp_fake: GcpComputeFake) -> None:
    gcp = make_provider(gcp_fake, placement_policy="no-such-policy")
    with pytest.raises(InvalidRequest, match="no-such-policy"):
        gcp.launch(gang("req-nopolicy", 2))
    assert gcp_fake.live() == []


def test_a_compact_policy_holds_one_zone(gcp_fake: GcpComputeFake) -> None:
    """The fake refuses what GCP refuses: a gang must not straddle zones."""
    gcp_fake.add_resource_policy("proj-1", "us-central1", "compact-z")
    gcp = make_provider(gcp_fake, placement_policy="compact-z")
    gcp.launch(gang("req-zb", 2))  # A100_OD is in us-central1-b
    other = dataclasses.replace(A100_OD, zone="us-central1-a")
    with pytest.raises(InvalidRequest, match="one zone"):
        gcp.launch(dataclasses.replace(request("req-za", other), nodes=2, gang="g-za"))


@pytest.mark.parametrize("failing", [1, 2])
def test_no_capacity_for_one_vm_deletes_the_others(gcp_fake: GcpComputeFake, failing: int) -> None:
    gcp = make_provider(gcp_fake)
    gcp_fake.fail_insert("ZONE_RESOURCE_POOL_EXHAUSTED", "no A100 in us-central1-b", after=failing)
    with pytest.raises(CapacityError, match=rf"{failing} of 3 a2-highgpu-1g VMs started.*deleted them") as err:
        gcp.launch(gang("req-nocap", 3))
    assert err.value.scope is Scope.OFFERING
    gcp.list("test")  # the fake completes deletions at the next listing
    assert gcp_fake.live() == [], "never a half gang billing"


def test_a_quota_error_mid_gang_rolls_back_and_keeps_its_scope(gcp_fake: GcpComputeFake) -> None:
    gcp = make_provider(gcp_fake)
    gcp_fake.fail_insert(
        "QUOTA_EXCEEDED", "GPUS_ALL_REGIONS", http_status=403, quota_metric="GPUS_ALL_REGIONS", after=1
    )
    with pytest.raises(QuotaError):
        gcp.launch(gang("req-quota", 2))
    gcp.list("test")
    assert gcp_fake.live() == []


def test_a_retry_finishes_a_gang_a_crash_left_half_made(gcp_fake: GcpComputeFake) -> None:
    gcp = make_provider(gcp_fake)
    gcp.launch(request("req-half", A100_OD))  # index 0 of req-half, as a crashed attempt left it
    out = gcp.launch(gang("req-half", 2))
    assert len(out) == 2 and len(gcp_fake.live()) == 2


def test_zero_nodes_is_refused(gcp_fake: GcpComputeFake) -> None:
    with pytest.raises(InvalidRequest, match="at least one node"):
        make_provider(gcp_fake).launch(dataclasses.replace(request("req-0", A100_OD), nodes=0))
