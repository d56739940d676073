"""The fake provider honours the provider contract and its test/simulation knobs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from autoscaler.clock import ManualClock
from providers.base import (
    CapacityError,
    InstanceStatus,
    LaunchRequest,
    Offering,
    Provider,
    QuotaError,
    RateLimited,
    Scope,
)
from providers.fake import FakeProvider

SPOT = Offering("g.1", "spot", "z-a", 1, "A10G", 4, 16000, 0.4)
OD = Offering("g.1", "on_demand", "z-a", 1, "A10G", 4, 16000, 1.0)


def req(request_id: str, offering: Offering = SPOT, owner: str = "test") -> LaunchRequest:
    return LaunchRequest(
        request_id=request_id,
        pool="gpu",
        owner=owner,
        offering=offering,
        tags={"autoscaler-team": "vision"},
    )


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(datetime(2026, 3, 10, 12, 0, tzinfo=UTC))


@pytest.fixture
def fake(clock: ManualClock) -> FakeProvider:
    return FakeProvider([SPOT, OD], clock=clock.now, boot_delay_s=60)


def test_satisfies_the_protocol(fake: FakeProvider) -> None:
    assert isinstance(fake, Provider)
    assert fake.offerings() == [SPOT, OD]


def test_launch_is_idempotent_by_request_id(fake: FakeProvider) -> None:
    first = fake.launch(req("r1"))
    again = fake.launch(req("r1"))
    assert [i.instance_id for i in first] == [i.instance_id for i in again]
    assert len(fake.instances) == 1
    assert {i.request_id for i in first} == {"r1"}
    assert first[0].tags["autoscaler-team"] == "vision"
    assert first[0].tags["autoscaler-request-id"] == "r1"


def test_boot_delay_follows_the_injected_clock(fake: FakeProvider, clock: ManualClock) -> None:
    (inst,) = fake.launch(req("r1"))
    assert inst.status is InstanceStatus.PENDING
    clock.advance(59)
    assert fake.list("test")[0].status is InstanceStatus.PENDING
    clock.advance(1)
    assert fake.list("test")[0].status is InstanceStatus.RUNNING


def test_list_filters_by_owner_and_terminate_is_idempotent(fake: FakeProvider) -> None:
    (mine,) = fake.launch(req("r1"))
    fake.launch(req("r2", owner="someone-else"))
    assert [i.instance_id for i in fake.list("test")] == [mine.instance_id]
    fake.terminate([mine.instance_id])
    fake.terminate([mine.instance_id, "never-existed"])  # already gone = success
    assert fake.list("test") == []


def test_listing_lag_models_eventual_consistency(clock: ManualClock) -> None:
    fake = FakeProvider([SPOT], clock=clock.now, list_lag_s=5)
    (inst,) = fake.launch(req("r1"))
    assert fake.list("test") == []
    clock.advance(5)
    assert len(fake.list("test")) == 1
    fake.terminate([inst.instance_id])
    assert len(fake.list("test")) == 1, "a terminate is seen late, too"
    clock.advance(5)
    assert fake.list("test") == []


def test_fail_next_raises_once_then_launch_succeeds(fake: FakeProvider) -> None:
    fake.fail_next(RateLimited("slow down", retry_after_s=3))
    with pytest.raises(RateLimited) as err:
        fake.launch(req("r1"))
    assert err.value.retry_after_s == 3
    assert len(fake.launch(req("r1"))) == 1, "a failed launch records nothing; the retry launches"
    assert [c.method for c in fake.calls] == ["launch", "launch"]


def test_error_pattern_blocks_matching_calls_only(fake: FakeProvider) -> None:
    rule = fake.fail_when(lambda r: r.offering.capacity_type == "spot", CapacityError("no spot"))
    for n in range(3):
        with pytest.raises(CapacityError):
            fake.launch(req(f"s{n}"))
    assert len(fake.launch(req("od", offering=OD))) == 1
    fake.clear_faults()
    assert len(fake.launch(req("s9"))) == 1
    assert rule.times is None


def test_fault_on_terminate_and_list(fake: FakeProvider) -> None:
    fake.fail_next(QuotaError("too many", scope=Scope.REGION), method="list")
    with pytest.raises(QuotaError):
        fake.list("test")
    assert fake.list("test") == []


def test_capacity_limit_then_capacity_error(fake: FakeProvider) -> None:
    fake.set_capacity(SPOT.key, 2)
    assert len(fake.launch(req("a"))) == 1
    assert len(fake.launch(req("b"))) == 1
    with pytest.raises(CapacityError) as err:
        fake.launch(req("c"))
    assert err.value.scope is Scope.OFFERING
    assert len(fake.launch(req("d", offering=OD))) == 1, "other offerings are unaffected"


def test_preempt_is_listed_announced_once_and_cleared_by_terminate(fake: FakeProvider) -> None:
    (inst,) = fake.launch(req("r1"))
    fake.preempt(inst.instance_id)
    (listed,) = fake.list("test")
    assert listed.status is InstanceStatus.PREEMPTED
    events = fake.interruptions()
    assert [e.instance_id for e in events] == [inst.instance_id]
    assert fake.interruptions() == []
    fake.terminate([inst.instance_id])
    assert fake.list("test") == []
    assert fake.live() == []


def test_scheduled_preemption_gives_notice_first(fake: FakeProvider, clock: ManualClock) -> None:
    (inst,) = fake.launch(req("r1"))
    fake.schedule_preemption(inst.instance_id, clock.now() + timedelta(seconds=300), notice_s=120)
    clock.advance(179)
    assert fake.interruptions() == []
    clock.advance(1)
    (event,) = fake.interruptions()
    assert event.deadline == clock.now() + timedelta(seconds=120)
    assert fake.list("test")[0].status is InstanceStatus.RUNNING
    clock.advance(120)
    assert fake.list("test")[0].status is InstanceStatus.PREEMPTED
    assert fake.interruptions() == [], "announced once"


def test_thousands_of_launches_stay_cheap(clock: ManualClock) -> None:
    fake = FakeProvider([SPOT], clock=clock.now, record_calls=False)
    for n in range(2000):
        fake.launch(req(f"r{n}"))
    assert len(fake.list("test")) == 2000
    assert fake.calls == []


def test_a_gang_launch_is_n_machines_tagged_with_the_gang_or_none(fake: FakeProvider) -> None:
    from dataclasses import replace

    from providers.fake import GANG_TAG

    got = fake.launch(replace(req("r-gang"), nodes=3, gang="t-1"))
    assert len(got) == 3 and len({i.instance_id for i in got}) == 3
    assert all(i.tags[GANG_TAG] == "t-1" for i in got)
    # Retried with the same request id: the same three, not three more.
    assert [i.instance_id for i in fake.launch(replace(req("r-gang"), nodes=3, gang="t-1"))] == [
        i.instance_id for i in got
    ]
    assert len(fake.live()) == 3
    # Capacity for fewer than all of a gang's machines launches none of them.
    fake.set_capacity(OD.key, 2)
    with pytest.raises(CapacityError, match=r"3 x g\.1"):
        fake.launch(replace(req("r-gang-2", OD), nodes=3, gang="t-2"))
    assert len(fake.live()) == 3
    assert len(fake.launch(replace(req("r-gang-3", OD), nodes=2, gang="t-3"))) == 2
