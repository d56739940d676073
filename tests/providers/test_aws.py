"""The AWS driver against moto in server mode, over real HTTP, with real boto3.

Faults and ClientToken memory come from the middleware in tests/fakes/aws.py.
"""

from __future__ import annotations

import base64
import json
import re
import time
from typing import Any

import boto3
import pytest
from botocore.config import Config

from providers.aws import AwsProvider, AwsSettings, client_token, map_error
from providers.base import (
    TAG_OWNER,
    TAG_POOL,
    TAG_REQUEST,
    TAG_TEAM,
    AuthError,
    CapacityError,
    InstanceStatus,
    InvalidRequest,
    LaunchRequest,
    NotFound,
    Offering,
    Provider,
    ProviderError,
    QuotaError,
    RateLimited,
    Scope,
    TransientError,
)
from providers.bootstrap import BootstrapSpec, parse_user_data, render_user_data
from tests.fakes.aws import REGION, TEST_CREDENTIALS, MotoEC2, unique_owner

AMI = "ami-03cf127a"  # one of moto's built-in images
JOIN = "asj_" + "j" * 43
G5_SPOT = Offering("g5.xlarge", "spot", None, 1, "A10G", 4, 16384, 0.45, region=REGION)
G5_OD = Offering("g5.xlarge", "on_demand", None, 1, "A10G", 4, 16384, 1.006, region=REGION)
G4_SPOT = Offering("g4dn.xlarge", "spot", None, 1, "T4", 4, 16384, 0.2, region=REGION)
G4_OD = Offering("g4dn.xlarge", "on_demand", None, 1, "T4", 4, 16384, 0.526, region=REGION)


SESSION = boto3.session.Session(region_name=REGION, **TEST_CREDENTIALS)  # one model load for all tests


def make(moto: MotoEC2, *, attempts: int = 1, **options: Any) -> AwsProvider:
    settings = AwsSettings.from_options(REGION, {"endpoint_url": moto.url, **options}, image=AMI)
    session = SESSION
    config = Config(retries={"mode": "standard", "total_max_attempts": attempts})
    return AwsProvider(settings, [G5_SPOT, G5_OD, G4_SPOT, G4_OD], session=session, boto_config=config)


def user_data() -> str:
    spec = BootstrapSpec(server_url="https://scaler.example", pool="gpu", provider="aws", join_token=JOIN)
    return render_user_data(spec)


OWNER = "unset"


@pytest.fixture(autouse=True)
def owner() -> str:
    """A fresh owner tag per test: the moto backend is shared across the session."""
    global OWNER
    OWNER = unique_owner()
    return OWNER


def req(rid: str, offering: Offering = G5_SPOT, *, owner: str | None = None, **kw: Any) -> LaunchRequest:
    return LaunchRequest(
        request_id=rid,
        pool="gpu",
        owner=owner or OWNER,
        offering=offering,
        user_data=user_data(),
        tags={TAG_TEAM: "vision"},
        **kw,
    )


def subnets(moto: MotoEC2) -> dict[str, str]:
    resp = moto.client().describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]}])
    return {s["AvailabilityZone"]: s["SubnetId"] for s in resp["Subnets"]}


@pytest.fixture(params=["fleet", "run_instances"])
def aws(request: pytest.FixtureRequest, moto_ec2: MotoEC2) -> AwsProvider:
    """Both launch paths: a fleet needs a choice (several subnets, offerings without a zone)."""
    if request.param == "fleet":
        return make(moto_ec2, launch_api="fleet", subnets=subnets(moto_ec2))
    return make(moto_ec2, launch_api="run_instances")


def tags_of(moto: MotoEC2, resource_id: str) -> dict[str, str]:
    resp = moto.client().describe_tags(Filters=[{"Name": "resource-id", "Values": [resource_id]}])
    return {t["Key"]: t["Value"] for t in resp["Tags"]}


# ---- launch, tags, list, terminate -------------------------------------------------


def test_spot_launch_tags_instance_and_volume(aws: AwsProvider, moto_ec2: MotoEC2) -> None:
    assert isinstance(aws, Provider)
    (inst,) = aws.launch(req("req-spot-1"))
    assert inst.capacity_type == "spot"
    assert inst.request_id == "req-spot-1"
    described = moto_ec2.client().describe_instances(InstanceIds=[inst.instance_id])
    raw = described["Reservations"][0]["Instances"][0]
    assert raw["InstanceLifecycle"] == "spot", "really a spot instance, not just tagged so"
    expected = {TAG_OWNER: OWNER, TAG_POOL: "gpu", TAG_REQUEST: "req-spot-1", TAG_TEAM: "vision"}
    assert expected.items() <= tags_of(moto_ec2, inst.instance_id).items()
    volumes = [m["Ebs"]["VolumeId"] for m in raw["BlockDeviceMappings"]]
    assert volumes, "the instance has a root volume"
    for vol in volumes:
        assert expected.items() <= tags_of(moto_ec2, vol).items(), "volumes carry the same tags"


def test_on_demand_launch_list_by_owner_and_terminate(aws: AwsProvider) -> None:
    mine = aws.launch(req("req-od-1", G5_OD)) + aws.launch(req("req-od-2", G5_OD))
    assert {i.capacity_type for i in mine} == {"on_demand"}
    aws.launch(req("req-other", G5_OD, owner=OWNER + "-other"))
    listed = aws.list(OWNER)
    assert sorted(i.instance_id for i in listed) == sorted(i.instance_id for i in mine)
    assert all(i.status in (InstanceStatus.PENDING, InstanceStatus.RUNNING) for i in listed)
    assert all(i.pool == "gpu" and i.capacity_type == "on_demand" for i in listed)
    aws.terminate([mine[0].instance_id])
    assert [i.instance_id for i in aws.list(OWNER)] == [mine[1].instance_id]
    # Already gone, unknown and malformed ids are success, and do not stop the others.
    aws.terminate([mine[0].instance_id, "i-0123456789abcdef0", mine[1].instance_id])
    assert aws.list(OWNER) == []
    assert len(aws.list(OWNER + "-other")) == 1


def test_fleet_spreads_an_offering_without_a_zone_over_the_subnets(moto_ec2: MotoEC2) -> None:
    by_zone = subnets(moto_ec2)
    aws = make(moto_ec2, launch_api="fleet", subnets=by_zone)
    [spot] = aws.launch(req("req-fleet-spot", G5_SPOT))
    [on_demand] = aws.launch(req("req-fleet-od", G4_OD))
    (fleet_call, od_call) = moto_ec2.calls("CreateFleet")
    p = fleet_call.params
    assert p["Type"] == "instant"
    assert p["SpotOptions.AllocationStrategy"] == "price-capacity-optimized"
    assert p["TargetCapacitySpecification.DefaultTargetCapacityType"] == "spot"
    assert p["TargetCapacitySpecification.TotalTargetCapacity"] == "1"
    overrides = {
        (p[f"LaunchTemplateConfigs.1.Overrides.{n}.InstanceType"], p[f"LaunchTemplateConfigs.1.Overrides.{n}.SubnetId"])
        for n in range(1, len(by_zone) + 1)
    }
    assert overrides == {("g5.xlarge", s) for s in by_zone.values()}, "one type (the planner's), every subnet"
    assert f"LaunchTemplateConfigs.1.Overrides.{len(by_zone) + 1}.InstanceType" not in p
    assert od_call.params["OnDemandOptions.AllocationStrategy"] == "lowest-price"
    listed = {i.instance_id: i for i in aws.list(OWNER)}
    assert listed[spot.instance_id].capacity_type == "spot"
    assert listed[on_demand.instance_id].capacity_type == "on_demand"
    assert listed[spot.instance_id].zone in by_zone
    # The per-launch template (which held the user-data) is gone after the call.
    assert moto_ec2.client().describe_launch_templates()["LaunchTemplates"] == []


@pytest.mark.parametrize("where", ["an offering's zone", "one subnet", "the default VPC"])
def test_a_launch_with_no_placement_choice_is_one_run_instances_call(moto_ec2: MotoEC2, where: str) -> None:
    by_zone = subnets(moto_ec2)
    options: dict[str, Any] = {"launch_api": "fleet"}
    offering = G4_OD
    if where == "an offering's zone":
        options["subnets"] = by_zone
        offering = Offering("g4dn.xlarge", "on_demand", "us-east-1b", 1, "T4", 4, 16384, 0.526, region=REGION)
    elif where == "one subnet":
        options["subnets"] = [by_zone["us-east-1a"]]
    aws = make(moto_ec2, **options)
    moto_ec2.clear()
    [inst] = aws.launch(req("req-single", offering))
    actions = [c.action for c in moto_ec2.calls()]
    assert actions.count("RunInstances") == 1
    assert not {"CreateFleet", "CreateLaunchTemplate", "DeleteLaunchTemplate"} & set(actions), actions
    if where != "the default VPC":
        expected = "us-east-1b" if where == "an offering's zone" else "us-east-1a"
        assert {i.zone for i in aws.list(OWNER) if i.instance_id == inst.instance_id} == {expected}


# ---- idempotency -------------------------------------------------------------------


def test_same_request_id_twice_yields_one_instance(aws: AwsProvider, moto_ec2: MotoEC2) -> None:
    first = aws.launch(req("req-idem-1"))
    again = aws.launch(req("req-idem-1"))
    assert sorted(i.instance_id for i in again) == sorted(i.instance_id for i in first)
    assert len(aws.list(OWNER)) == 1
    launches = len(moto_ec2.calls("RunInstances")) + len(moto_ec2.calls("CreateFleet"))
    assert launches == 1, "the request-id tag was found before calling EC2 again"


def test_client_token_covers_a_listing_that_lags(aws: AwsProvider, moto_ec2: MotoEC2) -> None:
    first = aws.launch(req("req-idem-2"))
    moto_ec2.lag_listings(times=1)  # the tag lookup sees nothing, as right after a launch
    again = aws.launch(req("req-idem-2"))
    assert [i.instance_id for i in again] == [i.instance_id for i in first]
    assert len(aws.list(OWNER)) == 1, "EC2 honoured the ClientToken: no second instance"
    tokens = [c.params.get("ClientToken") for c in moto_ec2.calls() if c.action in ("RunInstances", "CreateFleet")]
    assert tokens == ["req-idem-2", "req-idem-2"]


def test_client_token_is_ec2_sized() -> None:
    assert client_token("abc") == "abc"
    long = client_token("x" * 100)
    assert len(long) == 64 and long == client_token("x" * 100)
    assert client_token("é") != "é"


# ---- user-data and the join token -------------------------------------------------


def test_user_data_carries_only_the_join_token(aws: AwsProvider, moto_ec2: MotoEC2) -> None:
    (inst,) = aws.launch(req("req-ud-1"))
    attr = moto_ec2.client().describe_instance_attribute(InstanceId=inst.instance_id, Attribute="userData")
    text = base64.b64decode(attr["UserData"]["Value"]).decode()
    boot = parse_user_data(text)
    assert boot["join_token"] == JOIN
    assert set(boot) == {
        "server_url",
        "pool",
        "provider",
        "join_token",
        "join_token_ref",
        "instance_id",
        "labels",
        "simulated_gpus",
        "metadata_url",
    }
    for secret_marker in (
        "asa_",
        "ast_",
        "asw_",
        "aws_secret",
        "AKIA",
        TEST_CREDENTIALS["aws_secret_access_key"],
    ):
        assert secret_marker not in text
    # Everything sent to EC2 (launch template data included) holds no other secret either.
    sent = json.dumps([c.params for c in moto_ec2.calls()])
    assert "asa_" not in sent and "asw_" not in sent


# ---- error mapping through HTTP ----------------------------------------------------


@pytest.mark.parametrize(
    ("code", "status", "error", "scope"),
    [
        ("InsufficientInstanceCapacity", 500, CapacityError, Scope.OFFERING),
        ("UnfulfillableCapacity", 400, CapacityError, Scope.OFFERING),
        ("MaxSpotInstanceCountExceeded", 400, CapacityError, Scope.REGION),
        ("VcpuLimitExceeded", 400, QuotaError, Scope.REGION),
        ("InstanceLimitExceeded", 400, QuotaError, Scope.REGION),
        ("RequestLimitExceeded", 503, RateLimited, Scope.PROVIDER),
        ("Throttling", 400, RateLimited, Scope.PROVIDER),
        ("AuthFailure", 401, AuthError, Scope.PROVIDER),
        ("UnauthorizedOperation", 403, AuthError, Scope.PROVIDER),
        ("InternalError", 500, TransientError, Scope.PROVIDER),
        ("InvalidAMIID.NotFound", 400, InvalidRequest, Scope.OFFERING),
    ],
)
def test_launch_errors_map_to_typed_errors(
    aws: AwsProvider, moto_ec2: MotoEC2, code: str, status: int, error: type[ProviderError], scope: Scope
) -> None:
    action = "CreateFleet" if aws.settings.launch_api == "fleet" else "RunInstances"
    moto_ec2.arm(action, code, f"{code} injected", status=status)
    with pytest.raises(error) as info:
        aws.launch(req("req-err"))
    assert info.value.code == code
    assert info.value.scope is scope
    assert code in info.value.message
    assert aws.list(OWNER) == []
    assert moto_ec2.client().describe_launch_templates()["LaunchTemplates"] == [], "no template leaked"
    # The fault was one-shot: the same request id then launches normally.
    assert len(aws.launch(req("req-err"))) == 1


def test_instant_fleet_errors_reported_in_the_body(moto_ec2: MotoEC2) -> None:
    aws = make(moto_ec2, launch_api="fleet", subnets=subnets(moto_ec2))
    moto_ec2.arm("CreateFleet", "InsufficientInstanceCapacity", "no g5 in us-east-1a", in_body=True)
    with pytest.raises(CapacityError) as info:
        aws.launch(req("req-body"))
    assert info.value.scope is Scope.OFFERING
    assert "no g5" in info.value.message


def test_throttling_is_retried_by_botocore_when_attempts_allow(moto_ec2: MotoEC2) -> None:
    aws = make(moto_ec2, attempts=3, launch_api="run_instances")
    moto_ec2.arm("RunInstances", "RequestLimitExceeded", status=503, times=1)
    assert len(aws.launch(req("req-retry"))) == 1
    assert [c.status for c in moto_ec2.calls("RunInstances")] == [503, 200]


def test_list_and_terminate_errors_are_typed(moto_ec2: MotoEC2) -> None:
    aws = make(moto_ec2)
    moto_ec2.arm("DescribeInstances", "RequestLimitExceeded", status=503)
    with pytest.raises(RateLimited):
        aws.list(OWNER)
    moto_ec2.arm("TerminateInstances", "UnauthorizedOperation", status=403)
    with pytest.raises(AuthError):
        aws.terminate(["i-0123456789abcdef0"])


def test_unreachable_endpoint_is_transient() -> None:
    settings = AwsSettings.from_options(REGION, {"endpoint_url": "http://127.0.0.1:9"}, image=AMI)
    session = SESSION
    aws = AwsProvider(
        settings,
        [],
        session=session,
        boto_config=Config(retries={"total_max_attempts": 1}, connect_timeout=1),
    )
    with pytest.raises(TransientError, match="cannot reach EC2"):
        aws.list(OWNER)


@pytest.mark.parametrize(
    ("code", "status", "error"),
    [
        ("InvalidInstanceID.NotFound", 400, NotFound),
        ("SomethingNew", 400, InvalidRequest),
        ("SomethingNew", 503, TransientError),
        ("InvalidSubnetID.NotFound", 400, InvalidRequest),
        ("ThrottlingException", 400, RateLimited),
        ("InsufficientFreeAddressesInSubnet", 400, CapacityError),
    ],
)
def test_error_table(code: str, status: int, error: type) -> None:
    assert type(map_error(code, "m", status)) is error


# ---- prices, settings, interruptions ------------------------------------------------


def test_spot_prices_from_history_with_catalog_fallback(moto_ec2: MotoEC2) -> None:
    aws = make(moto_ec2)
    prices = {(o.instance_type, o.capacity_type): o.hourly_price for o in aws.offerings()}
    # moto's history is a dummy (0.00001) but it is EC2's answer, not the catalog's.
    assert prices[("g5.xlarge", "spot")] == pytest.approx(0.00001)
    assert prices[("g5.xlarge", "on_demand")] == 1.006
    fresh = make(moto_ec2)
    moto_ec2.arm("DescribeSpotPriceHistory", "UnauthorizedOperation", status=403)
    fallback = {(o.instance_type, o.capacity_type): o.hourly_price for o in fresh.offerings()}
    assert fallback[("g5.xlarge", "spot")] == 0.45


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subnet": ["s"]}, "options.subnet: unknown option; did you mean 'subnets'?"),
        ({"subnets": "subnet-1"}, "options.subnets"),
        ({"launch_api": "spot_fleet"}, "options.launch_api: Input should be 'fleet' or 'run_instances'"),
        ({"max_attempts": 0}, "options.max_attempts: Input should be greater than or equal to 1"),
        ({"region": "us-west-2"}, "options.region: unknown option"),
    ],
)
def test_settings_refuse_bad_options(options: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRequest, match=re.escape(message)) as caught:
        AwsSettings.from_options(REGION, options)
    assert "\n" not in caught.value.message and caught.value.message.startswith("invalid AWS pool options.")


def test_launch_without_an_image_says_what_to_do(moto_ec2: MotoEC2) -> None:
    settings = AwsSettings.from_options(REGION, {"endpoint_url": moto_ec2.url})
    session = SESSION
    aws = AwsProvider(settings, [], session=session)
    with pytest.raises(InvalidRequest, match="has no AMI: set `image`"):
        aws.launch(req("r"))


def test_interruption_and_rebalance_events_from_sqs(moto_ec2: MotoEC2) -> None:
    sqs = moto_ec2.client("sqs")
    url = sqs.create_queue(QueueName=f"interruptions-{OWNER}")["QueueUrl"]
    aws = make(moto_ec2, interruption_queue_url=url)
    assert aws.capabilities.interruption_events
    bodies = [
        {
            "detail-type": "EC2 Spot Instance Interruption Warning",
            "time": "2026-03-10T12:00:00Z",
            "detail": {"instance-id": "i-1", "instance-action": "terminate"},
        },
        {
            "detail-type": "EC2 Instance Rebalance Recommendation",
            "time": "2026-03-10T12:00:05Z",
            "detail": {"instance-id": "i-2"},
        },
        {"detail-type": "EC2 Instance State-change Notification", "detail": {"instance-id": "i-3"}},
        "not json",
    ]
    for b in bodies:
        sqs.send_message(QueueUrl=url, MessageBody=b if isinstance(b, str) else json.dumps(b))
    events = aws.interruptions()
    assert sorted((e.instance_id, e.kind) for e in events) == [("i-1", "interruption"), ("i-2", "rebalance")]
    spot = next(e for e in events if e.kind == "interruption")
    assert spot.deadline is not None and (spot.deadline - spot.at).total_seconds() == 120
    assert aws.interruptions() == [], "received notices stay invisible until acknowledged"
    assert all(e.receipt for e in events)
    aws.acknowledge(events)
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    # The notices are deleted once acknowledged; the two unparseable messages at once.
    assert attrs["ApproximateNumberOfMessages"] == "0" and attrs["ApproximateNumberOfMessagesNotVisible"] == "0"


def test_an_unacknowledged_notice_is_delivered_again(moto_ec2: MotoEC2) -> None:
    """A notice read by a cycle whose transaction never committed (crash, rollback) is
    not lost: SQS delivers it again after the visibility timeout."""
    sqs = moto_ec2.client("sqs")
    url = sqs.create_queue(QueueName=f"redeliver-{OWNER}", Attributes={"VisibilityTimeout": "1"})["QueueUrl"]
    aws = make(moto_ec2, interruption_queue_url=url)
    body = {
        "detail-type": "EC2 Spot Instance Interruption Warning",
        "time": "2026-03-10T12:00:00Z",
        "detail": {"instance-id": "i-9", "instance-action": "terminate"},
    }
    sqs.send_message(QueueUrl=url, MessageBody=json.dumps(body))
    (first,) = aws.interruptions()
    time.sleep(1.5)
    (again,) = aws.interruptions()
    assert again.instance_id == first.instance_id == "i-9"
    aws.acknowledge([again])
    time.sleep(1.5)
    assert aws.interruptions() == []
