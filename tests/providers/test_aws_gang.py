"""AWS gangs on the moto server: N instances in one RunInstances call (MinCount =
MaxCount = N), one subnet, optionally a cluster placement group, all or nothing.

Placement groups are modelled by tests/fakes/aws_placement.py (moto 5 has none).
"""

from __future__ import annotations

from typing import Any

import pytest

import tests.providers.test_aws as aws_tests
from providers.aws import AwsSettings
from providers.aws.driver import placement_group_name
from providers.base import TAG_GANG, TAG_OWNER, TAG_REQUEST, CapacityError, InvalidRequest, Offering, Scope
from tests.fakes.aws import REGION, MotoEC2, unique_owner
from tests.providers.test_aws import G5_OD, G5_SPOT, make, req, subnets, tags_of


@pytest.fixture(autouse=True)
def owner() -> str:
    """A fresh owner tag per test (`req` reads it from test_aws)."""
    aws_tests.OWNER = unique_owner("gang")
    return aws_tests.OWNER


def gang_req(rid: str, nodes: int, offering: Offering = G5_OD, gang: str | None = None) -> Any:
    return req(rid, offering, nodes=nodes, gang=gang or f"gang-{rid}")


def groups(moto: MotoEC2, owner: str) -> dict[str, dict[str, str]]:
    resp = moto.client().describe_placement_groups(Filters=[{"Name": f"tag:{TAG_OWNER}", "Values": [owner]}])
    return {g["GroupName"]: {t["Key"]: t["Value"] for t in g.get("Tags", [])} for g in resp["PlacementGroups"]}


@pytest.mark.parametrize("launch_api", ["fleet", "run_instances"])
def test_a_gang_is_one_run_instances_call_in_one_zone(moto_ec2: MotoEC2, owner: str, launch_api: str) -> None:
    aws = make(moto_ec2, launch_api=launch_api, subnets=subnets(moto_ec2))
    gang = aws.launch(gang_req("req-gang-1", 3))
    assert len(gang) == 3
    (call,) = moto_ec2.calls("RunInstances")
    assert (call.params["MinCount"], call.params["MaxCount"]) == ("3", "3"), "EC2 is all or nothing"
    assert not moto_ec2.calls("CreateFleet"), "a fleet may spread the gang over zones"
    listed = {i.instance_id: i for i in aws.list(owner)}
    assert set(listed) == {i.instance_id for i in gang}
    assert len({listed[i].zone for i in listed}) == 1, "one zone"
    for inst in gang:
        assert inst.request_id == "req-gang-1"
        tags = tags_of(moto_ec2, inst.instance_id)
        assert tags[TAG_GANG] == "gang-req-gang-1" and tags[TAG_REQUEST] == "req-gang-1"
    # Idempotent: a retry after a crash finds the three and starts nothing.
    again = aws.launch(gang_req("req-gang-1", 3))
    assert sorted(i.instance_id for i in again) == sorted(listed)
    assert len(moto_ec2.calls("RunInstances")) == 1
    assert not groups(moto_ec2, owner), "no placement group unless the pool asks for one"


def test_spot_gang(moto_ec2: MotoEC2) -> None:
    aws = make(moto_ec2)
    gang = aws.launch(gang_req("req-gang-spot", 2, G5_SPOT))
    assert [i.capacity_type for i in gang] == ["spot", "spot"]
    (call,) = moto_ec2.calls("RunInstances")
    assert call.params["InstanceMarketOptions.MarketType"] == "spot"


def test_managed_cluster_placement_group_lives_as_long_as_its_gang(moto_ec2: MotoEC2, owner: str) -> None:
    aws = make(moto_ec2, placement_group={"strategy": "cluster"}, placement_group_grace_s=0)
    gang = aws.launch(gang_req("req-pg-1", 2, gang="g-pg-1"))
    name = placement_group_name("g-pg-1")
    (create,) = moto_ec2.calls("CreatePlacementGroup")
    assert create.params["Strategy"] == "cluster" and create.params["GroupName"] == name
    (run,) = moto_ec2.calls("RunInstances")
    assert run.params["Placement.GroupName"] == name
    assert groups(moto_ec2, owner)[name][TAG_GANG] == "g-pg-1"
    # A retry (same gang) reuses the group, does not fail on the duplicate.
    aws.launch(gang_req("req-pg-1", 2, gang="g-pg-1"))
    # The listing keeps the group while its gang lives...
    aws.list(owner)
    assert name in groups(moto_ec2, owner)
    aws.terminate([i.instance_id for i in gang])
    # ...and deletes it once no instance of the gang is left.
    aws.list(owner)
    assert name not in groups(moto_ec2, owner)


def test_a_young_group_survives_the_listing(moto_ec2: MotoEC2, owner: str) -> None:
    """Between CreatePlacementGroup and RunInstances a group has no instance yet."""
    aws = make(moto_ec2, placement_group={"strategy": "cluster"})  # grace: 600 s
    gang = aws.launch(gang_req("req-pg-young", 2))
    aws.terminate([i.instance_id for i in gang])
    aws.list(owner)
    assert placement_group_name("gang-req-pg-young") in groups(moto_ec2, owner)


def test_no_capacity_for_the_whole_gang_leaves_nothing(moto_ec2: MotoEC2, owner: str) -> None:
    aws = make(moto_ec2, placement_group={"strategy": "cluster"})
    moto_ec2.arm("RunInstances", "InsufficientInstanceCapacity", "We currently do not have sufficient capacity")
    with pytest.raises(CapacityError) as err:
        aws.launch(gang_req("req-pg-nocap", 4))
    assert err.value.scope is Scope.OFFERING
    assert aws.list(owner) == []
    assert groups(moto_ec2, owner) == {}, "the group this launch created is deleted at once"


def test_a_partial_gang_found_on_retry_is_terminated(moto_ec2: MotoEC2, owner: str) -> None:
    aws = make(moto_ec2)
    gang = aws.launch(gang_req("req-partial", 3))
    moto_ec2.client().terminate_instances(InstanceIds=[gang[0].instance_id])  # e.g. reclaimed
    with pytest.raises(CapacityError, match=r"2 of 3 instances left.*terminated them") as err:
        aws.launch(gang_req("req-partial", 3))
    assert err.value.scope is Scope.OFFERING and err.value.code == "PartialGang"
    assert aws.list(owner) == [], "never a half gang billing"


def test_a_replayed_client_token_is_not_taken_for_a_gang(moto_ec2: MotoEC2, owner: str) -> None:
    """EC2 answers a repeated ClientToken with the first response, dead instances and all."""
    aws = make(moto_ec2)
    gang = aws.launch(gang_req("req-replay", 2))
    moto_ec2.client().terminate_instances(InstanceIds=[i.instance_id for i in gang])
    with pytest.raises(CapacityError, match="launch the gang under a new request id") as err:
        aws.launch(gang_req("req-replay", 2))
    assert err.value.code == "ReplayedGang"
    assert aws.list(owner) == []


def test_a_named_group_is_used_and_never_deleted(moto_ec2: MotoEC2, owner: str) -> None:
    moto_ec2.client().create_placement_group(
        GroupName=f"ops-{owner}",
        Strategy="cluster",
        TagSpecifications=[{"ResourceType": "placement-group", "Tags": [{"Key": TAG_OWNER, "Value": owner}]}],
    )
    moto_ec2.clear()
    aws = make(moto_ec2, placement_group=f"ops-{owner}", placement_group_grace_s=0)
    gang = aws.launch(gang_req("req-named", 2))
    assert moto_ec2.calls("RunInstances")[0].params["Placement.GroupName"] == f"ops-{owner}"
    assert not moto_ec2.calls("CreatePlacementGroup")
    aws.terminate([i.instance_id for i in gang])
    aws.list(owner)
    assert f"ops-{owner}" in groups(moto_ec2, owner), "the operator's group is theirs"


def test_an_unknown_named_group_is_a_config_error(moto_ec2: MotoEC2, owner: str) -> None:
    aws = make(moto_ec2, placement_group="no-such-group")
    with pytest.raises(InvalidRequest, match="no-such-group") as err:
        aws.launch(gang_req("req-unknown-pg", 2))
    assert err.value.code == "InvalidPlacementGroup.Unknown"
    assert aws.list(owner) == []


def test_a_cluster_group_holds_one_zone(moto_ec2: MotoEC2, owner: str) -> None:
    """The fake refuses what EC2 refuses: the driver must put a gang in one zone."""
    by_zone = subnets(moto_ec2)
    moto_ec2.client().create_placement_group(GroupName=f"z-{owner}", Strategy="cluster")
    aws = make(moto_ec2, placement_group=f"z-{owner}", subnets=by_zone)
    a = Offering("g5.xlarge", "on_demand", "us-east-1a", 1, "A10G", 4, 16384, 1.0, region=REGION)
    b = Offering("g5.xlarge", "on_demand", "us-east-1b", 1, "A10G", 4, 16384, 1.0, region=REGION)
    aws.launch(gang_req("req-zone-a", 2, a))
    with pytest.raises(InvalidRequest, match="one zone"):
        aws.launch(gang_req("req-zone-b", 2, b))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"placement_group": {"strategy": "spread"}}, "options.placement_group"),
        ({"placement_group": {"stratgy": "cluster"}}, "placement_group.managed.stratgy: Extra inputs"),
        ({"placement_group": {"strategy": "spread"}}, "should be 'cluster'"),
        ({"placement_group_grace_s": -1}, "options.placement_group_grace_s"),
    ],
)
def test_placement_options_are_checked(options: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        AwsSettings.from_options(REGION, options)


def test_zero_nodes_is_refused(moto_ec2: MotoEC2) -> None:
    with pytest.raises(InvalidRequest, match="at least one node"):
        make(moto_ec2).launch(req("req-zero", G5_OD, nodes=0))
