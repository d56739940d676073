"""Azure gangs against the ARM fake: N VMs in one zone, a proximity placement group on
each, rollback when one of them fails."""

from __future__ import annotations

import dataclasses

import pytest

from providers.base import CapacityError, InvalidRequest, LaunchRequest, QuotaError, Scope
from tests.fakes.azure import AzureArmFake
from tests.providers_cloud.conftest import SUBSCRIPTION
from tests.providers_cloud.test_azure import T4_REGULAR, make_provider, request


def gang(rid: str, nodes: int, gang_id: str = "gang-az") -> LaunchRequest:
    return dataclasses.replace(request(rid, T4_REGULAR), nodes=nodes, gang=gang_id)


def test_a_gang_is_n_vms_in_one_zone_with_the_gang_tag(azure_fake: AzureArmFake) -> None:
    azure = make_provider(azure_fake)
    out = azure.launch(gang("req-az-g", 3))
    assert len(out) == 3 and len({i.instance_id for i in out}) == 3
    assert {i.zone for i in out} == {"2"}
    assert all(i.request_id == "req-az-g" and i.tags["autoscaler-gang"] == "gang-az" for i in out)
    assert all("proximityPlacementGroup" not in vm["properties"] for vm in azure_fake.vms.values())
    listed = azure.list("test")
    assert sorted(i.instance_id for i in listed) == sorted(i.instance_id for i in out)
    again = azure.launch(gang("req-az-g", 3))
    assert sorted(i.instance_id for i in again) == sorted(i.instance_id for i in out)
    assert len(azure_fake.vms) == 3


def test_gang_vms_join_the_proximity_placement_group(azure_fake: AzureArmFake) -> None:
    ppg = azure_fake.add_proximity_placement_group(SUBSCRIPTION, "gpu-rg", "ppg-1", "eastus")
    azure = make_provider(azure_fake, proximity_placement_group="ppg-1")
    out = azure.launch(gang("req-ppg", 2))
    assert azure_fake.proximity_groups[ppg.lower()]["members"] == {i.instance_id for i in out}
    [single] = azure.launch(request("req-ppg-single", T4_REGULAR))
    assert single.instance_id not in azure_fake.proximity_groups[ppg.lower()]["members"], "a single VM does not join"


def test_an_unknown_proximity_group_is_a_config_error_and_leaves_nothing(azure_fake: AzureArmFake) -> None:
    azure = make_provider(azure_fake, proximity_placement_group="no-such-ppg")
    with pytest.raises(InvalidRequest, match=r"no-such-ppg.*options\.proximity_placement_group"):
        azure.launch(gang("req-noppg", 2))
    azure.list("test")
    assert azure_fake.vms == {} and azure_fake.nics == {}


@pytest.mark.parametrize("failing", [1, 2])
def test_no_capacity_for_one_vm_deletes_the_others(azure_fake: AzureArmFake, failing: int) -> None:
    azure = make_provider(azure_fake)
    azure_fake.fail_create("AllocationFailed", "Allocation failed.", after=failing, leave_behind=True)
    with pytest.raises(CapacityError, match=rf"{failing} of 3 Standard_NC4as_T4_v3 VMs started.*deleted them") as err:
        azure.launch(gang("req-az-nocap", 3))
    assert err.value.scope is Scope.OFFERING
    azure.list("test")  # the fake finishes deletions at the next listing
    assert azure_fake.vms == {} and azure_fake.nics == {} and azure_fake.disks == set(), "no half gang billing"


def test_a_quota_error_mid_gang_rolls_back_and_keeps_its_type(azure_fake: AzureArmFake) -> None:
    azure = make_provider(azure_fake)
    azure_fake.fail_create(
        "OperationNotAllowed",
        "Operation could not be completed as it results in exceeding approved quota.",
        sync=True,
        after=1,
    )
    with pytest.raises(QuotaError):
        azure.launch(gang("req-az-quota", 2))
    azure.list("test")
    assert azure_fake.vms == {}


def test_a_retry_finishes_a_gang_a_crash_left_half_made(azure_fake: AzureArmFake) -> None:
    azure = make_provider(azure_fake)
    azure.launch(request("req-az-half", T4_REGULAR))  # index 0, as a crashed attempt left it
    assert len(azure.launch(gang("req-az-half", 2))) == 2
    assert len(azure_fake.vms) == 2


def test_zero_nodes_is_refused(azure_fake: AzureArmFake) -> None:
    with pytest.raises(InvalidRequest, match="at least one node"):
        make_provider(azure_fake).launch(gang("req-az-0", 0))
