"""The Azure driver: one pool's VMs in a resource group through azure-mgmt-compute.

- VM names are derived from the launch request id, which makes a launch idempotent the
  way ARM is: a PUT is keyed by the resource name. A retried launch first GETs the VM
  and returns it when it exists (re-PUTting would try to change `customData`, which ARM
  refuses on an existing VM).
- Each VM gets its own NIC in the configured subnet (azure-mgmt-network); both the NIC
  and the OS disk are created with `deleteOption: Delete`, so deleting the VM deletes
  them.
- A create that fails (allocation, quota) can leave the VM resource behind in a Failed
  state, and always leaves the NIC: both are deleted before the error is raised.
- A gang (`request.nodes` = N > 1) is N VMs (indices 0..N-1) in the offering's zone,
  each in the pool's `proximity_placement_group` when it names one. If one fails, the
  VMs already created are deleted and the launch raises (`CapacityError` for capacity,
  else the error itself), so no half gang is left; a retry of the same request finds
  the VMs already made by name and creates only the missing ones.
- `list` lists the resource group and keeps VMs whose owner tag matches (ARM has no tag
  filter on this call).
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Sequence
from typing import Any

from providers.azure.errors import from_http_error
from providers.azure.settings import AzureSettings
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

_STATUS = {
    "Creating": InstanceStatus.PENDING,
    "Updating": InstanceStatus.RUNNING,
    "Succeeded": InstanceStatus.RUNNING,
    "Deleting": InstanceStatus.STOPPING,
    # A Failed VM is reported (not hidden) so the reconciler's boot timeout deletes it
    # if our own clean-up after a failed create did not.
    "Failed": InstanceStatus.PENDING,
}


def _import_sdk() -> tuple[Any, Any, Any]:
    core_exceptions = import_extra("azure.core.exceptions", extra="azure", package="azure-core")
    compute = import_extra("azure.mgmt.compute", extra="azure", package="azure-mgmt-compute")
    network = import_extra("azure.mgmt.network", extra="azure", package="azure-mgmt-network")
    return compute.ComputeManagementClient, network.NetworkManagementClient, core_exceptions


def vm_name(prefix: str, request_id: str, index: int) -> str:
    """A valid, deterministic VM name (letters, digits, '-'; at most 64 characters)."""
    slug = re.sub(r"[^a-z0-9]+", "-", request_id.lower()).strip("-")[:30].strip("-")
    digest = hashlib.sha256(request_id.encode()).hexdigest()[:8]
    return "-".join(p for p in (prefix, slug, digest, str(index)) if p)[:64]


class AzureProvider:
    """A pool of Azure VMs; see the module docstring for the contract details."""

    name = "azure"
    capabilities = Capabilities()

    def __init__(
        self,
        settings: AzureSettings,
        offerings: Sequence[Offering],
        *,
        credential: Any = None,
        client_kwargs: dict[str, Any] | None = None,
    ) -> None:
        compute_cls, network_cls, self._errors = _import_sdk()
        self.settings = settings
        self._offerings = list(offerings)
        kwargs: dict[str, Any] = {"retry_total": settings.sdk_retries, **(client_kwargs or {})}
        if settings.base_url:
            kwargs["base_url"] = settings.base_url
        if credential is None:
            identity = import_extra("azure.identity", extra="azure", package="azure-identity")
        try:
            if credential is None:
                credential = identity.DefaultAzureCredential()
            self._compute = compute_cls(credential, settings.subscription_id, **kwargs)
            self._network = network_cls(credential, settings.subscription_id, **kwargs)
        except Exception as exc:
            raise AuthError(f"Azure credentials unavailable: {exc}", code="NoCredentials") from None

    # ---- the Provider protocol -----------------------------------------------------

    def offerings(self) -> list[Offering]:
        return list(self._offerings)

    def launch(self, request: LaunchRequest) -> list[ProviderInstance]:
        if request.nodes < 1:
            raise InvalidRequest(f"a launch needs at least one node, got nodes={request.nodes}")
        # Index i: the deterministic name keeps the form it had when a request could ask
        # for several VMs, so VMs launched before still match their request.
        names = [vm_name(self.settings.name_prefix, request.request_id, i) for i in range(request.nodes)]
        out: list[ProviderInstance] = []
        for name in names:
            try:
                out.append(self._launch_one(request, name))
            except ProviderError as exc:
                if request.nodes == 1:
                    raise
                raise gang_rollback_error(
                    request,
                    exc,
                    delete_all=lambda: self.terminate(names),
                    started=len(out),
                    where=request.offering.zone or self.settings.location,
                    placement_fix=None
                    if not self.settings.proximity_placement_group
                    else f"options.proximity_placement_group must name an existing proximity placement group in "
                    f"{self.settings.location}",
                ) from None
        return out

    def list(self, owner: str) -> list[ProviderInstance]:
        out: list[ProviderInstance] = []
        try:
            for vm in self._compute.virtual_machines.list(self.settings.resource_group):
                tags = dict(vm.tags or {})
                if tags.get(TAG_OWNER) == owner:
                    out.append(self._view(vm))
        except self._errors.HttpResponseError as exc:
            raise from_http_error(exc, where=f"resource group {self.settings.resource_group}") from None
        except self._errors.AzureError as exc:
            raise TransientError(f"Azure list failed: {exc}") from None
        return out

    def terminate(self, instance_ids: Sequence[str]) -> None:
        first_error: ProviderError | None = None
        for name in instance_ids:
            try:
                self._delete_vm(name)
            except ProviderError as exc:
                first_error = first_error or exc
        if first_error is not None:
            raise first_error

    # ---- internals -----------------------------------------------------------------

    def _launch_one(self, request: LaunchRequest, name: str) -> ProviderInstance:
        existing = self._get_vm(name)
        if existing is not None and existing.provisioning_state != "Failed":
            return self._view(existing)  # an earlier attempt created it
        where = f"{self.settings.location}{'/' + request.offering.zone if request.offering.zone else ''}"
        try:
            nic_id = self._create_nic(request, name)
            vm = self._compute.virtual_machines.begin_create_or_update(
                self.settings.resource_group, name, self._vm_body(request, name, nic_id)
            ).result()
        except self._errors.HttpResponseError as exc:
            error = from_http_error(exc, where=where)
            self._clean_up_failed(name)
            raise error from None
        except self._errors.AzureError as exc:
            # Unknown outcome (timeout, connection): leave the VM to the listing; the
            # next attempt with the same request id finds it by name.
            raise TransientError(f"Azure create of {name} failed: {exc}") from None
        return self._view(vm)

    def _get_vm(self, name: str) -> Any:
        try:
            return self._compute.virtual_machines.get(self.settings.resource_group, name)
        except self._errors.ResourceNotFoundError:
            return None
        except self._errors.HttpResponseError as exc:
            raise from_http_error(exc, where=f"resource group {self.settings.resource_group}") from None
        except self._errors.AzureError as exc:
            raise TransientError(f"Azure get of {name} failed: {exc}") from None

    def _create_nic(self, request: LaunchRequest, name: str) -> str:
        nic = self._network.network_interfaces.begin_create_or_update(
            self.settings.resource_group,
            f"{name}-nic",
            {
                "location": self.settings.location,
                "tags": request.all_tags(),
                "properties": {
                    "ipConfigurations": [
                        {
                            "name": "ipconfig1",
                            "properties": {
                                "subnet": {"id": self.settings.subnet_id},
                                "privateIPAllocationMethod": "Dynamic",
                            },
                        }
                    ]
                },
            },
        ).result()
        return str(nic.id)

    def _clean_up_failed(self, name: str) -> None:
        """Delete what a failed create left behind (the VM resource, the NIC)."""
        try:
            self._delete_vm(name, wait=True)
            self._network.network_interfaces.begin_delete(self.settings.resource_group, f"{name}-nic").result()
        except (ProviderError, self._errors.AzureError):
            pass  # the owner-tagged leftovers show up in `list`; the reconciler retries

    def _delete_vm(self, name: str, *, wait: bool = False) -> None:
        try:
            # Deleting takes minutes in Azure; the listing shows `Deleting` meanwhile, so
            # the reconcile loop does not wait (polling=False sends the DELETE only).
            poller = self._compute.virtual_machines.begin_delete(self.settings.resource_group, name, polling=wait)
            if wait:
                poller.result()
        except self._errors.ResourceNotFoundError:
            return  # already gone: success
        except self._errors.HttpResponseError as exc:
            error = from_http_error(exc, where=f"resource group {self.settings.resource_group}")
            if error.code not in ("ResourceNotFound", "NotFound"):
                raise error from None
        except self._errors.AzureError as exc:
            raise TransientError(f"Azure delete of {name} failed: {exc}") from None

    def _vm_body(self, request: LaunchRequest, name: str, nic_id: str) -> dict[str, Any]:
        """The VM in ARM's wire shape (what the REST reference documents), sent as is."""
        s = self.settings
        offering = request.offering
        image = request.image or s.image
        if not image:
            raise InvalidRequest(
                f"Azure pool {request.pool!r} has no image: set the pool's image to an image id or "
                "publisher:offer:sku:version",
                scope=Scope.PROVIDER,
                code="NoImage",
            )
        key = {"path": f"/home/{s.admin_username}/.ssh/authorized_keys", "keyData": s.ssh_public_key}
        props: dict[str, Any] = {
            "hardwareProfile": {"vmSize": offering.instance_type},
            "storageProfile": {
                "imageReference": _image_reference(image),
                "osDisk": {
                    "createOption": "FromImage",
                    "deleteOption": "Delete",
                    "diskSizeGB": s.os_disk_size_gb,
                    "managedDisk": {"storageAccountType": s.os_disk_type},
                },
            },
            "osProfile": {
                "computerName": name,
                "adminUsername": s.admin_username,
                "customData": base64.b64encode(request.user_data.encode()).decode(),
                "linuxConfiguration": {"disablePasswordAuthentication": True, "ssh": {"publicKeys": [key]}},
            },
            "networkProfile": {
                "networkInterfaces": [{"id": nic_id, "properties": {"primary": True, "deleteOption": "Delete"}}]
            },
            "priority": "Regular",
        }
        if request.nodes > 1 and s.proximity_placement_group:
            props["proximityPlacementGroup"] = {"id": self._ppg_id(s.proximity_placement_group)}
        if offering.capacity_type == "spot":
            props.update(priority="Spot", evictionPolicy="Delete", billingProfile={"maxPrice": s.max_price})
        body: dict[str, Any] = {"location": s.location, "tags": request.all_tags(), "properties": props}
        if offering.zone:
            body["zones"] = [offering.zone]
        return body

    def _ppg_id(self, ppg: str) -> str:
        if ppg.startswith("/subscriptions/"):
            return ppg
        s = self.settings
        return (
            f"/subscriptions/{s.subscription_id}/resourceGroups/{s.resource_group}"
            f"/providers/Microsoft.Compute/proximityPlacementGroups/{ppg}"
        )

    def _view(self, vm: Any) -> ProviderInstance:
        tags = dict(vm.tags or {})
        capacity: CapacityType = "spot" if (vm.priority or "Regular") == "Spot" else "on_demand"
        zones = list(vm.zones or [])
        return ProviderInstance(
            instance_id=str(vm.name),
            request_id=tags.get(TAG_REQUEST),
            pool=tags.get(TAG_POOL),
            instance_type=str(vm.hardware_profile.vm_size) if vm.hardware_profile else "",
            capacity_type=capacity,
            zone=zones[0] if zones else None,
            status=_STATUS.get(str(vm.provisioning_state), InstanceStatus.PENDING),
            launched_at=getattr(vm, "time_created", None),
            tags=tags,
        )


def _image_reference(image: str) -> dict[str, str]:
    if image.startswith("/subscriptions/"):
        return {"id": image}
    parts = image.split(":")
    if len(parts) != 4:
        raise InvalidRequest(
            f"Azure image {image!r} is neither a resource id nor publisher:offer:sku:version",
            scope=Scope.PROVIDER,
            code="InvalidImage",
        )
    publisher, offer, sku, version = parts
    return {"publisher": publisher, "offer": offer, "sku": sku, "version": version}
