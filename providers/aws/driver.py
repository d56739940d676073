"""The AWS EC2 provider: launch, list, terminate and price GPU instances with boto3.

Launches are idempotent twice over: before calling EC2 the driver looks for live
instances tagged with the request id (a retry after a crash between the call and the
record finds them), and the call itself carries the request id as EC2's `ClientToken`
(a retry racing a slow first call gets the first call's instances, not new ones).

Every instance and volume is tagged with owner, pool, request id, team and capacity
type, so `list` finds instances by owner tag and IAM can scope terminate to them.

One launch is one instance of the offering the planner chose. It is one RunInstances
call, unless the offering has no zone and the pool has several subnets: then (with
`launch_api: fleet`, the default) an instant CreateFleet lets EC2 pick the subnet
with capacity.

A gang (`request.nodes` > 1) is one RunInstances call with MinCount = MaxCount = N in
one subnet (the offering's zone's, else the pool's first), which EC2 fulfils all or
nothing; with the pool's `placement_group` option, into a cluster placement group.
A managed group (`{strategy: cluster}`) is named from the gang id, created before the
call (or reused: a retry finds it) and deleted by `list` once no live instance of the
gang is left and it is older than `placement_group_grace_s`; a failed launch deletes
the group it has just created at once.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from providers.aws.errors import map_error
from providers.aws.identity import verifier_from_options
from providers.aws.settings import AwsSettings, PlacementGroupOption
from providers.base import (
    TAG_GANG,
    TAG_OWNER,
    TAG_POOL,
    TAG_REQUEST,
    AuthError,
    Capabilities,
    CapacityError,
    CapacityType,
    InstanceStatus,
    InterruptionEvent,
    InvalidRequest,
    LaunchRequest,
    NotFound,
    Offering,
    ProviderError,
    ProviderInstance,
    TransientError,
    import_extra,
)
from providers.identity import IdentityVerifier

TAG_CAPACITY = "autoscaler-capacity-type"
# On a managed placement group: when the driver created it (ISO time), for the grace.
TAG_CREATED = "autoscaler-created-at"
LIVE_STATES = ["pending", "running", "stopping", "stopped", "shutting-down"]
SPOT_RECLAIMED = "Server.SpotInstanceTermination"
_STATUS = {
    "pending": InstanceStatus.PENDING,
    "running": InstanceStatus.RUNNING,
    "stopping": InstanceStatus.STOPPING,
    "stopped": InstanceStatus.STOPPING,
    "shutting-down": InstanceStatus.STOPPING,
}
_TERMINATE_BATCH = 500  # well under EC2's per-call limit


def client_token(request_id: str) -> str:
    """EC2 accepts up to 64 ASCII characters; longer or non-ASCII ids are hashed."""
    if len(request_id) <= 64 and request_id.isascii() and request_id.isprintable():
        return request_id
    return hashlib.sha256(request_id.encode()).hexdigest()


class AwsProvider:
    """See the module docstring. Needs the `aws` extra (boto3)."""

    def __init__(
        self,
        settings: AwsSettings,
        catalog: Sequence[Offering],
        *,
        session: Any = None,
        boto_config: Any = None,
        name: str = "aws",
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        # Lazy: the control plane runs without the aws extra.
        boto3 = import_extra("boto3", extra="aws", package="boto3")
        Config = import_extra("botocore.config", extra="aws", package="boto3").Config

        self.name = name
        self.settings = settings
        self.capabilities = Capabilities(interruption_events=bool(settings.interruption_queue_url))
        self._catalog = list(catalog)
        self._now = clock or (lambda: datetime.now(UTC))
        config = boto_config or Config(
            retries={"mode": "standard", "total_max_attempts": settings.max_attempts},
            connect_timeout=5,
            read_timeout=30,
        )
        self._session = session or boto3.session.Session(region_name=settings.region)
        self._config = config
        self.ec2 = self._session.client(
            "ec2", region_name=settings.region, endpoint_url=settings.endpoint_url, config=config
        )
        self._sqs: Any = None
        self._subnet_zones: dict[str, str] | None = None
        self._prices: tuple[float, dict[tuple[str, str], float]] | None = None

    # ---- the Provider protocol -----------------------------------------------------

    def identity_verifier(self) -> IdentityVerifier | None:
        """The registration hook: checks AWS-signed instance identity documents when the
        pool sets `identity_certificate` (see providers/aws/identity.py)."""
        options = {
            "identity_certificate": self.settings.identity_certificate,
            "identity_account_id": self.settings.identity_account_id,
        }
        return verifier_from_options(options, self.settings.region)

    def offerings(self) -> builtins.list[Offering]:
        """The configured catalog, with spot prices from EC2's price history when it answers."""
        try:
            spot = self._spot_prices()
        except ProviderError:
            spot = {}  # the catalog's prices stand in: a price lookup never blocks launches
        out = []
        for o in self._catalog:
            if o.capacity_type != "spot":
                out.append(o)
                continue
            if o.zone is not None:
                price = spot.get((o.instance_type, o.zone))
            else:
                prices = [p for (t, _), p in spot.items() if t == o.instance_type]
                price = min(prices) if prices else None
            out.append(o if price is None else _with_price(o, price))
        return out

    def launch(self, request: LaunchRequest) -> builtins.list[ProviderInstance]:
        image = request.image or self.settings.image
        if not image:
            raise InvalidRequest(
                f"pool {request.pool!r} has no AMI: set `image` on the pool (build one with agent_image/packer)"
            )
        if request.nodes < 1:
            raise InvalidRequest(f"a launch needs at least one node, got nodes={request.nodes}")
        existing = self._by_request(request)
        if request.nodes > 1:
            return self._launch_gang(request, image, existing)
        if existing:
            return existing
        placements = self._placements(request)
        # A fleet costs three calls (create a launch template, CreateFleet, delete the
        # template) where RunInstances costs one: it is worth it only when EC2 has a
        # choice to make, an offering without a zone over several subnets.
        if self.settings.launch_api == "fleet" and len(placements) > 1:
            return self._launch_fleet(request, image, placements)
        return self._launch_run_instances(request, image, placements[0])

    def list(self, owner: str) -> builtins.list[ProviderInstance]:
        out = self._describe([{"Name": f"tag:{TAG_OWNER}", "Values": [owner]}], include_reclaimed=True)
        if isinstance(self.settings.placement_group, PlacementGroupOption):
            # Best effort: a group left behind costs nothing but counts against a quota.
            with contextlib.suppress(ProviderError):
                self._delete_idle_placement_groups(owner, out)
        return out

    def terminate(self, instance_ids: Sequence[str]) -> None:
        ids = [i for i in dict.fromkeys(instance_ids) if i]
        for start in range(0, len(ids), _TERMINATE_BATCH):
            batch = ids[start : start + _TERMINATE_BATCH]
            try:
                self._call(self.ec2.terminate_instances, InstanceIds=batch)
            except NotFound:
                # EC2 refuses the whole call when one id is unknown; the others still
                # need terminating, and an unknown one is already gone (= success).
                for iid in batch:
                    with contextlib.suppress(NotFound):
                        self._call(self.ec2.terminate_instances, InstanceIds=[iid])

    def interruptions(self) -> builtins.list[InterruptionEvent]:
        """Spot interruption warnings and rebalance recommendations from the SQS queue."""
        url = self.settings.interruption_queue_url
        if not url:
            return []
        if self._sqs is None:
            self._sqs = self._session.client(
                "sqs",
                region_name=self.settings.region,
                endpoint_url=self.settings.endpoint_url,
                config=self._config,
            )
        events: builtins.list[InterruptionEvent] = []
        for _ in range(10):  # bounded: a flood must not stall a reconcile cycle
            resp = self._call(self._sqs.receive_message, QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
            messages = resp.get("Messages", [])
            if not messages:
                break
            junk = []
            for m in messages:
                event = parse_interruption(m.get("Body", ""))
                if event is None:
                    junk.append(m["ReceiptHandle"])
                else:
                    events.append(replace(event, receipt=m["ReceiptHandle"]))
            # An unparseable message is deleted at once, or it would come back forever; a
            # notice only once `acknowledge` says it was recorded (until then SQS keeps it
            # invisible for the queue's visibility timeout, then delivers it again).
            self._delete_messages(junk)
        return events

    def acknowledge(self, events: Sequence[InterruptionEvent]) -> None:
        """Delete the notices' messages from SQS: the reconciler recorded them."""
        self._delete_messages([e.receipt for e in events if e.receipt])

    def _delete_messages(self, receipts: Sequence[str]) -> None:
        url = self.settings.interruption_queue_url
        if not receipts or not url or self._sqs is None:
            return
        for start in range(0, len(receipts), 10):
            batch = receipts[start : start + 10]
            self._call(
                self._sqs.delete_message_batch,
                QueueUrl=url,
                Entries=[{"Id": str(n), "ReceiptHandle": r} for n, r in enumerate(batch)],
            )

    # ---- launching -----------------------------------------------------------------

    def _tags(self, request: LaunchRequest) -> builtins.list[dict[str, str]]:
        tags = {
            **self.settings.extra_tags,
            **request.all_tags(),
            TAG_CAPACITY: request.offering.capacity_type,
        }
        return [{"Key": k, "Value": v} for k, v in tags.items()]

    def _placements(self, request: LaunchRequest) -> builtins.list[dict[str, str]]:
        """Subnet (or zone, in a default VPC) choices for this request, in order."""
        zones = [request.offering.zone] if request.offering.zone else []
        subnets = self._subnets_by_zone()
        if subnets:
            chosen = [(z, s) for s, z in subnets.items() if not zones or z in zones]
            if not chosen:
                raise InvalidRequest(
                    f"no configured subnet in zone(s) {', '.join(zones)}: add one to the pool's `subnets` option"
                )
            return [{"SubnetId": s, "AvailabilityZone": z} for z, s in chosen]
        return [{"AvailabilityZone": z} for z in zones] or [{}]

    def _subnets_by_zone(self) -> dict[str, str]:
        """subnet id -> zone."""
        configured = self.settings.subnets
        if isinstance(configured, Mapping):
            return {s: z for z, s in configured.items()}
        if not configured:
            return {}
        if self._subnet_zones is None:
            resp = self._call(self.ec2.describe_subnets, SubnetIds=list(configured))
            self._subnet_zones = {s["SubnetId"]: s["AvailabilityZone"] for s in resp.get("Subnets", [])}
        return self._subnet_zones

    def _instance_data(self, request: LaunchRequest, image: str) -> dict[str, Any]:
        """Parameters common to RunInstances and a launch template's data."""
        tags = self._tags(request)
        data: dict[str, Any] = {
            "ImageId": image,
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": tags},
                {"ResourceType": "volume", "Tags": tags},
            ],
            # IMDSv2 only: a task cannot read instance credentials with a plain GET
            # forwarded from a confused deputy; hop limit 2 lets containers reach it.
            "MetadataOptions": {
                "HttpTokens": "required",
                "HttpEndpoint": "enabled",
                "HttpPutResponseHopLimit": 2,
            },
            # The agent powers the machine off after a drain: that must end the bill.
            "InstanceInitiatedShutdownBehavior": "terminate",
        }
        if self.settings.security_group_ids:
            data["SecurityGroupIds"] = list(self.settings.security_group_ids)
        if self.settings.instance_profile:
            key = "Arn" if self.settings.instance_profile.startswith("arn:") else "Name"
            data["IamInstanceProfile"] = {key: self.settings.instance_profile}
        if self.settings.key_name:
            data["KeyName"] = self.settings.key_name
        if self.settings.root_volume_gb:
            data["BlockDeviceMappings"] = [
                {
                    "DeviceName": "/dev/sda1",
                    "Ebs": {"VolumeSize": self.settings.root_volume_gb, "VolumeType": "gp3"},
                }
            ]
        return data

    def _launch_run_instances(
        self, request: LaunchRequest, image: str, place: Mapping[str, str]
    ) -> builtins.list[ProviderInstance]:
        o = request.offering
        params = self._run_instances_params(request, image, place, count=1)
        resp = self._call(self.ec2.run_instances, **params)
        return [self._view(i, fallback_capacity=o.capacity_type) for i in resp.get("Instances", [])]

    def _run_instances_params(
        self, request: LaunchRequest, image: str, place: Mapping[str, str], *, count: int
    ) -> dict[str, Any]:
        o = request.offering
        params = self._instance_data(request, image)
        params.update(
            InstanceType=o.instance_type,
            # MinCount = MaxCount: EC2 starts all of them or none (a gang's promise).
            MinCount=count,
            MaxCount=count,
            ClientToken=client_token(request.request_id),
            UserData=request.user_data,  # boto3 base64-encodes it
        )
        if "SubnetId" in place:
            params["SubnetId"] = place["SubnetId"]
        elif "AvailabilityZone" in place:
            params["Placement"] = {"AvailabilityZone": place["AvailabilityZone"]}
        if o.capacity_type == "spot":
            # No MaxPrice: the planner already refused offerings above the policy's
            # cap, and EC2's default cap (the on-demand price) bounds the rest.
            spot = {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}
            params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": spot}
        return params

    # ---- gangs ---------------------------------------------------------------------

    def _launch_gang(
        self, request: LaunchRequest, image: str, existing: builtins.list[ProviderInstance]
    ) -> builtins.list[ProviderInstance]:
        """N instances in one subnet, all or nothing (see the module docstring)."""
        n = request.nodes
        if len(existing) == n:
            return existing  # a retry after a crash: the gang is there
        if existing:
            # Fewer than N alive (some were reclaimed or terminated since): a half gang
            # is useless and bills, so it goes, and the planner launches a whole one.
            self.terminate([i.instance_id for i in existing])
            raise CapacityError(
                f"gang {request.gang or request.request_id}: {len(existing)} of {n} instances left "
                "from an earlier launch; terminated them, launch the whole gang again",
                code="PartialGang",
            )
        place = self._placements(request)[0]
        group, created = self._placement_group_for(request)
        o = request.offering
        try:
            params = self._run_instances_params(request, image, place, count=n)
            if group is not None:
                params.setdefault("Placement", {})["GroupName"] = group
            resp = self._call(self.ec2.run_instances, **params)
        except ProviderError:
            if created:
                with contextlib.suppress(ProviderError):
                    self._call(self.ec2.delete_placement_group, GroupName=group)
            raise
        out = [self._view(i, fallback_capacity=o.capacity_type) for i in resp.get("Instances", [])]
        if self._already_gone([i.instance_id for i in out]):
            # EC2 answers a repeated ClientToken with the first call's response, even when
            # those instances were terminated since: that is not a gang.
            raise CapacityError(
                f"gang {request.gang or request.request_id}: request {request.request_id} was launched "
                "before and its instances are gone (EC2 replays a ClientToken's first answer); "
                "launch the gang under a new request id",
                code="ReplayedGang",
            )
        if len(out) != n:
            # MinCount makes EC2 all or nothing; this guards against an API that is not.
            self.terminate([i.instance_id for i in out])
            raise CapacityError(
                f"gang {request.gang or request.request_id}: EC2 started {len(out)} of {n} "
                f"{o.instance_type} instances; terminated them",
                code="PartialGang",
            )
        return out

    def _already_gone(self, instance_ids: builtins.list[str]) -> bool:
        """Whether any of these just-returned instances is already terminated."""
        if not instance_ids:
            return False
        try:
            resp = self._call(self.ec2.describe_instances, InstanceIds=instance_ids)
        except NotFound:
            return False  # not visible yet: new instances, eventual consistency
        states = [i.get("State", {}).get("Name") for r in resp.get("Reservations", []) for i in r.get("Instances", [])]
        return any(state in ("shutting-down", "terminated") for state in states)

    def _placement_group_for(self, request: LaunchRequest) -> tuple[str | None, bool]:
        """(group name, whether this call created it) for a gang launch."""
        option = self.settings.placement_group
        if option is None:
            return None, False
        if isinstance(option, str):
            return option, False
        name = placement_group_name(request.gang or request.request_id)
        tags = {
            **self.settings.extra_tags,
            TAG_OWNER: request.owner,
            TAG_POOL: request.pool,
            TAG_GANG: request.gang or request.request_id,
            TAG_CREATED: self._now().isoformat(),
        }
        try:
            self._call(
                self.ec2.create_placement_group,
                GroupName=name,
                Strategy=option.strategy,
                TagSpecifications=[
                    {"ResourceType": "placement-group", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
                ],
            )
        except InvalidRequest as exc:
            if exc.code != "InvalidPlacementGroup.Duplicate":
                raise
            return name, False  # an earlier attempt of this gang created it
        return name, True

    def _delete_idle_placement_groups(self, owner: str, live: Sequence[ProviderInstance]) -> None:
        """Delete this owner's managed groups whose gang has no live instance left."""
        busy = {i.tags.get(TAG_GANG) for i in live if i.status is not InstanceStatus.PREEMPTED}
        resp = self._call(self.ec2.describe_placement_groups, Filters=[{"Name": f"tag:{TAG_OWNER}", "Values": [owner]}])
        now = self._now()
        for group in resp.get("PlacementGroups", []):
            tags = {t["Key"]: t["Value"] for t in group.get("Tags", [])}
            created = _parse_time(tags.get(TAG_CREATED))
            if tags.get(TAG_GANG) in busy or group.get("State") not in (None, "available"):
                continue
            if created is not None and (now - created).total_seconds() < self.settings.placement_group_grace_s:
                continue
            try:
                self._call(self.ec2.delete_placement_group, GroupName=group["GroupName"])
            except InvalidRequest as exc:
                # InUse: its instances are still shutting down; the next listing retries.
                if exc.code != "InvalidPlacementGroup.InUse":
                    raise

    def _launch_fleet(
        self, request: LaunchRequest, image: str, placements: Sequence[Mapping[str, str]]
    ) -> builtins.list[ProviderInstance]:
        o = request.offering
        token = client_token(request.request_id)
        template = f"autoscaler-{token}"
        data = self._instance_data(request, image)
        data["UserData"] = base64.b64encode(request.user_data.encode()).decode()
        create = {
            "LaunchTemplateName": template,
            "LaunchTemplateData": data,
            "TagSpecifications": [{"ResourceType": "launch-template", "Tags": self._tags(request)}],
        }
        # No ClientToken here: a template left by a crashed attempt of this request
        # may hold an older user-data, so it is replaced, not reused.
        try:
            self._call(self.ec2.create_launch_template, **create)
        except InvalidRequest as exc:
            if "AlreadyExists" not in exc.code:
                raise
            self._call(self.ec2.delete_launch_template, LaunchTemplateName=template)
            self._call(self.ec2.create_launch_template, **create)
        try:
            resp = self._call(self.ec2.create_fleet, **self._fleet_params(request, template, token, placements))
        finally:
            # An instant fleet is done when the call returns; the template (which holds
            # the user-data) is not needed any more, and templates count against a quota.
            with contextlib.suppress(ProviderError):
                self._call(self.ec2.delete_launch_template, LaunchTemplateName=template)
        zones = self._subnets_by_zone()
        out: builtins.list[ProviderInstance] = []
        for item in resp.get("Instances", []):
            override = item.get("LaunchTemplateAndOverrides", {}).get("Overrides", {})
            capacity: CapacityType = "spot" if item.get("Lifecycle") == "spot" else "on_demand"
            zone = override.get("AvailabilityZone") or zones.get(override.get("SubnetId", ""))
            for iid in item.get("InstanceIds", []):
                out.append(
                    ProviderInstance(
                        instance_id=iid,
                        request_id=request.request_id,
                        pool=request.pool,
                        instance_type=item.get("InstanceType") or override.get("InstanceType") or o.instance_type,
                        capacity_type=capacity,
                        zone=zone,
                        status=InstanceStatus.PENDING,
                        launched_at=self._now(),
                        tags=request.all_tags(),
                    )
                )
        if not out:
            errors = resp.get("Errors") or [{"ErrorCode": "UnfulfillableCapacity", "ErrorMessage": "no instances"}]
            first = errors[0]
            raise map_error(first.get("ErrorCode", "UnfulfillableCapacity"), first.get("ErrorMessage", ""))
        return out

    def _fleet_params(
        self, request: LaunchRequest, template: str, token: str, placements: Sequence[Mapping[str, str]]
    ) -> dict[str, Any]:
        o = request.offering
        overrides = []
        for place in placements:
            override: dict[str, Any] = {"InstanceType": o.instance_type, **place}
            if "SubnetId" in override:
                override.pop("AvailabilityZone")  # EC2 takes one or the other
            overrides.append(override)
        params: dict[str, Any] = {
            "ClientToken": token,
            "Type": "instant",
            "LaunchTemplateConfigs": [
                {
                    "LaunchTemplateSpecification": {"LaunchTemplateName": template, "Version": "$Latest"},
                    "Overrides": overrides,
                }
            ],
            "TargetCapacitySpecification": {
                "TotalTargetCapacity": 1,
                "DefaultTargetCapacityType": "spot" if o.capacity_type == "spot" else "on-demand",
            },
            "TagSpecifications": [{"ResourceType": "instance", "Tags": self._tags(request)}],
        }
        if o.capacity_type == "spot":
            params["SpotOptions"] = {
                "AllocationStrategy": self.settings.spot_allocation_strategy,
                "InstanceInterruptionBehavior": "terminate",
            }
        else:
            params["OnDemandOptions"] = {"AllocationStrategy": self.settings.on_demand_allocation_strategy}
        return params

    # ---- reading -------------------------------------------------------------------

    def _by_request(self, request: LaunchRequest) -> builtins.list[ProviderInstance]:
        return self._describe(
            [
                {"Name": f"tag:{TAG_REQUEST}", "Values": [request.request_id]},
                {"Name": f"tag:{TAG_OWNER}", "Values": [request.owner]},
                {"Name": "instance-state-name", "Values": LIVE_STATES},
            ],
            include_reclaimed=False,
        )

    def _describe(
        self, filters: builtins.list[dict[str, Any]], *, include_reclaimed: bool
    ) -> builtins.list[ProviderInstance]:
        out = []
        token: str | None = None
        while True:
            kw: dict[str, Any] = {"Filters": filters, "MaxResults": 1000}
            if token:
                kw["NextToken"] = token
            resp = self._call(self.ec2.describe_instances, **kw)
            for reservation in resp.get("Reservations", []):
                for inst in reservation.get("Instances", []):
                    view = self._view(inst)
                    if view.status is InstanceStatus.TERMINATED:
                        continue
                    if view.status is InstanceStatus.PREEMPTED and not include_reclaimed:
                        continue
                    out.append(view)
            token = resp.get("NextToken")
            if not token:
                return out

    def _view(self, inst: Mapping[str, Any], *, fallback_capacity: CapacityType | None = None) -> ProviderInstance:
        tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
        state = inst.get("State", {}).get("Name", "pending")
        if state == "terminated":
            reclaimed = inst.get("StateReason", {}).get("Code") == SPOT_RECLAIMED
            status = InstanceStatus.PREEMPTED if reclaimed else InstanceStatus.TERMINATED
        else:
            status = _STATUS.get(state, InstanceStatus.PENDING)
        if inst.get("InstanceLifecycle") == "spot" or tags.get(TAG_CAPACITY) == "spot":
            capacity: CapacityType = "spot"
        elif tags.get(TAG_CAPACITY) == "on_demand":
            capacity = "on_demand"
        else:
            capacity = fallback_capacity or "on_demand"
        launched = inst.get("LaunchTime")
        return ProviderInstance(
            instance_id=inst["InstanceId"],
            request_id=tags.get(TAG_REQUEST),
            pool=tags.get("autoscaler-pool"),
            instance_type=inst.get("InstanceType", ""),
            capacity_type=capacity,
            zone=inst.get("Placement", {}).get("AvailabilityZone"),
            status=status,
            launched_at=launched if isinstance(launched, datetime) else None,
            tags=tags,
            private_ip=inst.get("PrivateIpAddress"),
        )

    def _spot_prices(self) -> dict[tuple[str, str], float]:
        now = time.monotonic()
        if self._prices is not None and now - self._prices[0] < self.settings.price_cache_s:
            return self._prices[1]
        types = sorted({o.instance_type for o in self._catalog if o.capacity_type == "spot"})
        prices: dict[tuple[str, str], float] = {}
        if types:
            resp = self._call(
                self.ec2.describe_spot_price_history,
                InstanceTypes=types,
                ProductDescriptions=["Linux/UNIX"],
                StartTime=self._now(),
                MaxResults=1000,
            )
            # Newest first per (type, zone): the history is sorted by time, descending.
            history = sorted(resp.get("SpotPriceHistory", []), key=lambda h: h.get("Timestamp", 0), reverse=True)
            for h in history:
                key = (h["InstanceType"], h["AvailabilityZone"])
                if key not in prices:
                    with contextlib.suppress(KeyError, ValueError):
                        prices[key] = float(h["SpotPrice"])
        self._prices = (now, prices)
        return prices

    # ---- errors --------------------------------------------------------------------

    def _call(self, fn: Callable[..., Any], **kw: Any) -> Any:
        """Call boto3; every failure leaves as a typed ProviderError."""
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            NoCredentialsError,
            ParamValidationError,
            PartialCredentialsError,
        )

        try:
            return fn(**kw)
        except ClientError as exc:
            err = exc.response.get("Error", {})
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            raise map_error(str(err.get("Code", "Unknown")), str(err.get("Message", "")), status) from None
        except (NoCredentialsError, PartialCredentialsError) as exc:
            raise AuthError(
                f"no usable AWS credentials ({exc}): give the control plane an IAM role or AWS_PROFILE",
                code="NoCredentials",
            ) from None
        except ParamValidationError as exc:
            raise InvalidRequest(f"EC2 request refused by boto3: {exc}", code="ParamValidation") from None
        except BotoCoreError as exc:
            raise TransientError(f"cannot reach EC2: {exc}", code=type(exc).__name__) from None


def placement_group_name(gang: str) -> str:
    """EC2 group names take up to 255 ASCII characters; longer or odd gang ids are hashed."""
    return f"autoscaler-{client_token(gang)}"


def parse_interruption(body: str) -> InterruptionEvent | None:
    """An EventBridge EC2 event (as delivered to SQS) -> an InterruptionEvent, or None."""
    try:
        event = json.loads(body)
    except (TypeError, ValueError):
        return None
    if not isinstance(event, dict):
        return None
    detail = event.get("detail") or {}
    detail_type = str(event.get("detail-type"))
    kind = {
        "EC2 Spot Instance Interruption Warning": "interruption",
        "EC2 Instance Rebalance Recommendation": "rebalance",
    }.get(detail_type)
    iid = detail.get("instance-id") if isinstance(detail, dict) else None
    if kind is None or not iid:
        return None
    at = _parse_time(event.get("time")) or datetime.now(UTC)
    # A spot warning gives two minutes; EventBridge's event time is when it was issued.
    deadline = _parse_time(detail.get("instance-action-time")) if kind == "interruption" else None
    if kind == "interruption" and deadline is None:
        deadline = at + timedelta(minutes=2)
    return InterruptionEvent(
        instance_id=str(iid),
        kind="interruption" if kind == "interruption" else "rebalance",
        at=at,
        deadline=deadline,
        detail=detail_type + (f" ({detail['instance-action']})" if detail.get("instance-action") else ""),
    )


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _with_price(o: Offering, price: float) -> Offering:
    return replace(o, hourly_price=price)
