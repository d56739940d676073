"""The GCP Compute Engine driver: one pool's VMs through google-cloud-compute.

- `launch` inserts one VM per requested instance with GCP's `requestId` (a UUID derived
  from the launch request id, so a retried call returns the first call's operation) and a
  name derived from the same id (a retry with a lost requestId meets `alreadyExists`,
  which is success). It then waits on the zone operation, because capacity and quota
  errors arrive there, not in the insert's HTTP answer.
- The operation is waited on with a `ZoneOperationsClient` built with the *same* client
  options as the instances client: `insert().result()` would poll through a client built
  without them, i.e. the public endpoint (see docs/providers.md).
- A gang (`request.nodes` = N > 1) is N inserts (indices 0..N-1, each with its own
  name and requestId) in one zone, with the pool's `placement_policy` (a compact
  placement resource policy) on each VM. If one fails, the VMs already inserted are
  deleted and the launch raises (`CapacityError` for capacity, else the error itself),
  so no half gang is left. A retry of the same request finds the VMs already made
  (`alreadyExists` / the same requestId) and inserts only the missing ones.
- `list` is one aggregated (all zones) listing filtered by the owner label.
- Instance ids are `<zone>/<name>`: GCP names are unique per zone and every call needs
  the zone.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from providers.base import (
    TAG_OWNER,
    TAG_POOL,
    TAG_REQUEST,
    AuthError,
    Capabilities,
    CapacityType,
    InstanceStatus,
    InvalidRequest,
    LaunchRequest,
    Offering,
    ProviderError,
    ProviderInstance,
    Scope,
    TransientError,
    gang_rollback_error,
    import_extra,
)
from providers.gcp.errors import from_api_exception, from_errors
from providers.gcp.labels import instance_name, label_key, label_value, labels_from_tags, operation_request_id
from providers.gcp.settings import GcpSettings

# Machine families whose GPUs come with the machine type (no guestAccelerators).
_BUILT_IN_GPU_FAMILIES = ("a2-", "a3-", "a4-", "g2-")
# Metadata keys: cloud-init reads `user-data`; the others keep the exact (unsanitised)
# request id and pool, which labels may have lowercased.
_META_USER_DATA = "user-data"
_META_REQUEST = "autoscaler-request-id"
_META_POOL = "autoscaler-pool"

_STATUS = {
    "PROVISIONING": InstanceStatus.PENDING,
    "STAGING": InstanceStatus.PENDING,
    "RUNNING": InstanceStatus.RUNNING,
    "STOPPING": InstanceStatus.STOPPING,
    "SUSPENDING": InstanceStatus.STOPPING,
    "SUSPENDED": InstanceStatus.STOPPING,
    "REPAIRING": InstanceStatus.PENDING,
}


def _import_sdk() -> Any:
    return import_extra("google.cloud.compute_v1", extra="gcp", package="google-cloud-compute")


class GcpProvider:
    """A pool of Compute Engine VMs; see the module docstring for the contract details."""

    name = "gcp"
    capabilities = Capabilities()

    def __init__(self, settings: GcpSettings, offerings: Sequence[Offering], *, credentials: Any = None) -> None:
        self._compute = _import_sdk()
        from google.api_core import exceptions as api_exceptions
        from google.api_core.client_options import ClientOptions

        self._api_exceptions = api_exceptions
        self.settings = settings
        self._offerings = list(offerings)
        options = ClientOptions(api_endpoint=settings.api_endpoint) if settings.api_endpoint else None
        try:
            self._instances = self._compute.InstancesClient(credentials=credentials, client_options=options)
            self._operations = self._compute.ZoneOperationsClient(credentials=credentials, client_options=options)
        except Exception as exc:  # google.auth.exceptions.DefaultCredentialsError and kin
            raise AuthError(f"GCP credentials unavailable: {exc}", code="NoCredentials") from None

    # ---- the Provider protocol -----------------------------------------------------

    def offerings(self) -> list[Offering]:
        return list(self._offerings)

    def launch(self, request: LaunchRequest) -> list[ProviderInstance]:
        if request.nodes < 1:
            raise InvalidRequest(f"a launch needs at least one node, got nodes={request.nodes}")
        zone = request.offering.zone or self.settings.zones[0]
        # Index i: names and operation ids keep the form they had when a request could
        # ask for several instances, so instances launched before still match.
        names = [instance_name(self.settings.name_prefix, request.request_id, i) for i in range(request.nodes)]
        done: list[str] = []
        for index, name in enumerate(names):
            try:
                self._insert(request, zone, name, index)
            except ProviderError as exc:
                if request.nodes == 1:
                    raise
                raise gang_rollback_error(
                    request,
                    exc,
                    delete_all=lambda: self.terminate([f"{zone}/{name}" for name in names]),
                    started=len(done),
                    where=zone,
                    # An insert that names a missing resource: with a policy set, most likely it.
                    placement_fix=None
                    if not self.settings.placement_policy
                    else f"options.placement_policy must name a compact placement policy in region "
                    f"{self.settings.region}",
                ) from None
            done.append(name)
        return [self._launched_view(request, zone, name) for name in names]

    def list(self, owner: str) -> list[ProviderInstance]:
        compute = self._compute
        request = compute.AggregatedListInstancesRequest(
            project=self.settings.project,
            filter=f'labels.{label_key(TAG_OWNER)} = "{label_value(owner)}"',
        )
        out: list[ProviderInstance] = []
        try:
            for _scope, scoped in self._instances.aggregated_list(request=request, timeout=60):
                for inst in scoped.instances:
                    view = self._view(inst)
                    if view is not None:
                        out.append(view)
        except self._api_exceptions.GoogleAPICallError as exc:
            raise from_api_exception(exc, zone="all zones") from None
        except Exception as exc:  # transport errors: connection refused, timeouts
            raise TransientError(f"GCP list failed: {exc}") from None
        return out

    def terminate(self, instance_ids: Sequence[str]) -> None:
        first_error: ProviderError | None = None
        for instance_id in instance_ids:
            zone, _, name = instance_id.partition("/")
            if not zone or not name:
                raise InvalidRequest(f"not a GCP instance id (want <zone>/<name>): {instance_id!r}")
            try:
                self._instances.delete_unary(
                    request=self._compute.DeleteInstanceRequest(
                        project=self.settings.project,
                        zone=zone,
                        instance=name,
                        request_id=operation_request_id(instance_id, 0, "delete"),
                    ),
                    timeout=30,
                )
            except self._api_exceptions.NotFound:
                continue  # already gone: success
            except self._api_exceptions.GoogleAPICallError as exc:
                first_error = first_error or from_api_exception(exc, zone=zone)
            except Exception as exc:
                first_error = first_error or TransientError(f"GCP delete of {instance_id} failed: {exc}")
        # Deletion runs on in GCP; the listing shows STOPPING until it is done, so we do
        # not hold the reconcile loop waiting for it.
        if first_error is not None:
            raise first_error

    # ---- internals -----------------------------------------------------------------

    def _insert(self, request: LaunchRequest, zone: str, name: str, index: int) -> None:
        compute = self._compute
        body = self._instance_body(request, zone, name)
        try:
            operation = self._instances.insert_unary(
                request=compute.InsertInstanceRequest(
                    project=self.settings.project,
                    zone=zone,
                    instance_resource=body,
                    request_id=operation_request_id(request.request_id, index),
                ),
                timeout=60,
            )
        except self._api_exceptions.Conflict:
            return  # `alreadyExists`: an earlier attempt created it under this name
        except self._api_exceptions.GoogleAPICallError as exc:
            raise from_api_exception(exc, zone=zone) from None
        except Exception as exc:
            raise TransientError(f"GCP insert in {zone} failed: {exc}") from None
        self._wait(operation, zone)

    def _wait(self, operation: Any, zone: str) -> None:
        """Wait for a zone operation to finish and raise its error, if any.

        `operations.wait` returns when the operation is DONE or after about two minutes,
        whichever comes first, so it is called in a loop up to our own deadline. An
        operation still running then is left to the listing (the VM shows as PENDING).
        """
        done = self._compute.Operation.Status.DONE
        deadline = time.monotonic() + self.settings.operation_timeout_s
        while operation.status != done:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                operation = self._operations.wait(
                    project=self.settings.project,
                    zone=zone,
                    operation=operation.name,
                    timeout=min(remaining, 120),
                )
            except self._api_exceptions.GoogleAPICallError as exc:
                raise from_api_exception(exc, zone=zone) from None
            except Exception as exc:
                raise TransientError(f"GCP operation wait in {zone} failed: {exc}") from None
        errors = list(operation.error.errors) if operation.error else []
        if errors:
            triples = [(e.code, e.message, self._quota_metric(e)) for e in errors]
            status = operation.http_error_status_code or None
            raise from_errors(triples, http_status=status, zone=zone, fallback_message=operation.http_error_message)

    @staticmethod
    def _quota_metric(error: Any) -> str:
        for detail in error.error_details:
            info = detail.quota_info
            if info and (info.metric_name or info.limit_name):
                return f"{info.metric_name} {info.limit_name}"
        return ""

    def _instance_body(self, request: LaunchRequest, zone: str, name: str) -> Any:
        compute = self._compute
        s = self.settings
        offering = request.offering
        image = request.image or s.image
        if not image:
            raise InvalidRequest(
                f"GCP pool {request.pool!r} has no image: set the pool's image to a family or image URL",
                scope=Scope.PROVIDER,
                code="NoImage",
            )
        spot = offering.capacity_type == "spot"
        scheduling = compute.Scheduling(
            provisioning_model="SPOT" if spot else "STANDARD",
            # GPU VMs cannot live-migrate; spot VMs must terminate on maintenance anyway.
            on_host_maintenance="TERMINATE" if (spot or offering.gpus) else "MIGRATE",
            automatic_restart=not spot,
        )
        if spot:
            scheduling.instance_termination_action = s.spot_termination_action
        interface = compute.NetworkInterface(network=s.network)
        if s.subnetwork:
            interface.subnetwork = s.subnetwork
        if s.external_ip:
            interface.access_configs = [compute.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")]
        body = compute.Instance(
            name=name,
            machine_type=f"zones/{zone}/machineTypes/{offering.instance_type}",
            labels=labels_from_tags(request.all_tags()),
            metadata=compute.Metadata(
                items=[
                    compute.Items(key=_META_USER_DATA, value=request.user_data),
                    compute.Items(key=_META_REQUEST, value=request.request_id),
                    compute.Items(key=_META_POOL, value=request.pool),
                ]
            ),
            disks=[
                compute.AttachedDisk(
                    boot=True,
                    auto_delete=True,
                    initialize_params=compute.AttachedDiskInitializeParams(
                        source_image=image,
                        disk_size_gb=s.disk_size_gb,
                        disk_type=f"zones/{zone}/diskTypes/{s.disk_type}",
                    ),
                )
            ],
            network_interfaces=[interface],
            scheduling=scheduling,
        )
        if request.nodes > 1 and s.placement_policy:
            body.resource_policies = [self._policy_path(s.placement_policy)]
        accelerator = self._accelerator(offering)
        if accelerator:
            body.guest_accelerators = [
                compute.AcceleratorConfig(
                    accelerator_count=offering.gpus,
                    accelerator_type=f"zones/{zone}/acceleratorTypes/{accelerator}",
                )
            ]
        if s.service_account:
            body.service_accounts = [compute.ServiceAccount(email=s.service_account, scopes=list(s.scopes))]
        return body

    def _policy_path(self, policy: str) -> str:
        if "/" in policy:
            return policy
        return f"projects/{self.settings.project}/regions/{self.settings.region}/resourcePolicies/{policy}"

    def _accelerator(self, offering: Offering) -> str | None:
        if offering.gpus <= 0 or offering.instance_type.startswith(_BUILT_IN_GPU_FAMILIES):
            return None
        explicit = self.settings.accelerator_types.get(offering.instance_type)
        if explicit:
            return explicit
        if not offering.gpu_type:
            raise InvalidRequest(
                f"instance type {offering.instance_type} has {offering.gpus} GPU(s) but no accelerator type: "
                "set gpu_type (e.g. nvidia-tesla-t4) or options.accelerator_types",
                code="NoAcceleratorType",
            )
        return offering.gpu_type.lower()

    def _launched_view(self, request: LaunchRequest, zone: str, name: str) -> ProviderInstance:
        return ProviderInstance(
            instance_id=f"{zone}/{name}",
            request_id=request.request_id,
            pool=request.pool,
            instance_type=request.offering.instance_type,
            capacity_type=request.offering.capacity_type,
            zone=zone,
            status=InstanceStatus.PENDING,
            tags=request.all_tags(),
        )

    def _view(self, inst: Any) -> ProviderInstance | None:
        spot = inst.scheduling.provisioning_model == "SPOT" or bool(inst.scheduling.preemptible)
        if inst.status == "TERMINATED":
            # A stopped VM still holds its disk: report it so the reconciler deletes it;
            # for a spot VM that means GCP reclaimed it.
            status = InstanceStatus.PREEMPTED if spot else InstanceStatus.STOPPING
        else:
            status = _STATUS.get(inst.status, InstanceStatus.PENDING)
        zone = inst.zone.rsplit("/", 1)[-1]
        meta = {item.key: item.value for item in inst.metadata.items}
        labels = dict(inst.labels)
        capacity: CapacityType = "spot" if spot else "on_demand"
        ip = inst.network_interfaces[0].network_i_p if inst.network_interfaces else ""
        return ProviderInstance(
            instance_id=f"{zone}/{inst.name}",
            request_id=meta.get(_META_REQUEST) or labels.get(label_key(TAG_REQUEST)),
            pool=meta.get(_META_POOL) or labels.get(label_key(TAG_POOL)),
            instance_type=inst.machine_type.rsplit("/", 1)[-1],
            capacity_type=capacity,
            zone=zone,
            status=status,
            launched_at=_parse_time(inst.creation_timestamp),
            tags=labels,
            private_ip=ip or None,
        )


def _parse_time(value: str) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None
