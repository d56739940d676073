"""A local Azure Resource Manager fake for the real azure-mgmt-compute/-network clients.

What it reproduces, as ARM does it:
- `PUT .../Microsoft.Compute/virtualMachines/NAME?api-version=...` answers 201 with
  `provisioningState: Creating` and an `Azure-AsyncOperation` header (an absolute URL
  back to this fake); `GET` on that URL says `InProgress` for `operation_polls - 1` polls,
  then `Succeeded`, or `Failed` with `{"error": {"code", "message"}}`. PUT is keyed by
  name: a second PUT of the same VM is an update, and changing `customData` is refused
  (409 `PropertyChangeNotAllowed`).
- A failed create may leave the VM behind in `provisioningState: Failed`
  (`leave_behind=True`), as Azure does after allocation failures.
- `DELETE` answers 202 + `Azure-AsyncOperation` and removes the OS disk and NIC whose
  `deleteOption` is `Delete`; deleting a missing resource answers 204. A NIC still
  attached to a VM cannot be deleted (400 `NicInUse`). Pending deletions finish when
  polled or at the next VM listing (time passes in the cloud).
- A VM's `proximityPlacementGroup.id` must name a group that exists
  (`add_proximity_placement_group`; 404 `NotFound` otherwise) in the VM's location
  (400 `InvalidParameter` otherwise); ids compare case-insensitively, as in ARM.
- Requests without a bearer token answer 401; every call needs `api-version`.
- Faults: `fail_create(code, ...)` arms a synchronous error (with `Retry-After` for 429)
  or a failed long-running operation for the next VM creates.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from werkzeug.wrappers import Request, Response

from tests.fakes.cloud_rest import RestFake, json_response

_RG = r"^/subscriptions/([^/]+)/resourceGroups/([^/]+)/providers/"
_VMS = re.compile(_RG + r"Microsoft\.Compute/virtualMachines(?:/([^/]+))?$", re.IGNORECASE)
_NICS = re.compile(_RG + r"Microsoft\.Network/networkInterfaces/([^/]+)$", re.IGNORECASE)
_OPS = re.compile(r"^/subscriptions/([^/]+)/providers/Microsoft\.Compute/locations/([^/]+)/operations/([^/]+)$", re.I)


@dataclass
class AzureFault:
    code: str
    message: str
    status: int
    # Synchronous: the PUT's answer is the error. Otherwise the operation fails.
    sync: bool
    leave_behind: bool = False
    retry_after: int | None = None
    times: int = 1
    # Let this many creates through first (to fail the n-th VM of a gang).
    after: int = 0


@dataclass
class _Pending:
    polls: int
    verb: str
    name: str
    error: dict[str, Any] | None
    leave_behind: bool = False


class AzureArmFake(RestFake):
    def __init__(self, subnets: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.subnets = set(subnets)
        self.vms: dict[str, dict[str, Any]] = {}
        self.nics: dict[str, dict[str, Any]] = {}
        self.disks: set[str] = set()
        self.custom_data: dict[str, str] = {}
        self.faults: list[AzureFault] = []
        # lower-cased resource id -> {"location": ..., "members": set of VM names}
        self.proximity_groups: dict[str, dict[str, Any]] = {}
        self.operation_polls = 1
        self._ops: dict[str, _Pending] = {}
        self._op_status: dict[str, dict[str, Any]] = {}
        self._ids = itertools.count(1)

    # ---- test knobs ------------------------------------------------------------------

    def fail_create(
        self,
        code: str,
        message: str = "",
        *,
        status: int = 409,
        sync: bool = False,
        leave_behind: bool = False,
        retry_after: int | None = None,
        times: int = 1,
        after: int = 0,
    ) -> None:
        self.faults.append(
            AzureFault(code, message or f"{code} (fake)", status, sync, leave_behind, retry_after, times, after)
        )

    def add_proximity_placement_group(self, sub: str, rg: str, name: str, location: str) -> str:
        """Create a proximity placement group (as `az ppg create` does); returns its id."""
        ppg_id = f"/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/proximityPlacementGroups/{name}"
        with self.lock:
            self.proximity_groups[ppg_id.lower()] = {"location": location, "members": set()}
        return ppg_id

    def reset(self) -> None:
        with self.lock:
            self.proximity_groups.clear()
            self.vms.clear()
            self.nics.clear()
            self.disks.clear()
            self.custom_data.clear()
            self.faults.clear()
            self._ops.clear()
            self._op_status.clear()
            self.requests.clear()
            self.operation_polls = 1

    # ---- HTTP ------------------------------------------------------------------------

    def handle(self, request: Request, body: Any) -> Response:
        if not request.headers.get("Authorization", "").startswith("Bearer "):
            return _error(401, "AuthenticationFailed", "Authentication failed. The 'Authorization' header is missing.")
        api_version = request.args.get("api-version")
        if not api_version:
            return _error(400, "MissingApiVersionParameter", "The api-version query parameter is required.")
        path = request.path
        if m := _OPS.match(path):
            return self._poll(m.group(3))
        if m := _NICS.match(path):
            return self._nic(request.method, m.group(1), m.group(2), m.group(3), body)
        if m := _VMS.match(path):
            sub, rg, name = m.groups()
            if name is None and request.method == "GET":
                return self._list(rg)
            if name and request.method == "GET":
                vm = self.vms.get(name)
                if vm is None:
                    return _not_found("virtualMachines", name, rg)
                return json_response(vm)
            if name and request.method == "PUT":
                return self._put_vm(request, sub, rg, name, body, api_version)
            if name and request.method == "DELETE":
                return self._delete_vm(request, sub, name, api_version)
        return _error(404, "InvalidResourceType", f"no such fake route: {request.method} {path}")

    def _put_vm(self, request: Request, sub: str, rg: str, name: str, body: Any, api_version: str) -> Response:
        props = (body or {}).get("properties", {})
        custom = props.get("osProfile", {}).get("customData", "")
        if name in self.vms:
            if custom and custom != self.custom_data.get(name):
                return _error(409, "PropertyChangeNotAllowed", "Changing property 'customData' is not allowed.")
            return json_response(self.vms[name])
        problem = self._validate_vm(body)
        if problem:
            return _error(400, "InvalidParameter", problem)
        ppg_ref = props.get("proximityPlacementGroup", {}).get("id")
        ppg = self.proximity_groups.get(str(ppg_ref).lower()) if ppg_ref else None
        if ppg_ref and ppg is None:
            return _not_found("proximityPlacementGroups", str(ppg_ref).rsplit("/", 1)[-1], rg)
        if ppg is not None and ppg["location"] != body["location"]:
            return _error(
                400,
                "InvalidParameter",
                f"Proximity placement group {ppg_ref} is in {ppg['location']}, not {body['location']}.",
            )
        fault = self._take_fault()
        if fault is not None and fault.sync:
            headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else None
            return _error(fault.status, fault.code, fault.message, headers)
        location = body["location"]
        vm = {
            "id": f"/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachines/{name}",
            "name": name,
            "type": "Microsoft.Compute/virtualMachines",
            "location": location,
            "tags": body.get("tags", {}),
            "zones": body.get("zones", []),
            "properties": {
                **{k: v for k, v in props.items() if k != "osProfile"},
                # ARM never returns customData.
                "osProfile": {k: v for k, v in props.get("osProfile", {}).items() if k != "customData"},
                "provisioningState": "Creating",
                "vmId": str(uuid.uuid4()),
                "timeCreated": datetime.now(UTC).isoformat(),
            },
        }
        self.vms[name] = vm
        if ppg is not None:
            ppg["members"].add(name)
        self.custom_data[name] = custom
        self.disks.add(f"{name}_OsDisk")
        error = None
        if fault is not None:
            error = {"code": fault.code, "message": fault.message}
        op = self._start_op("create", name, error, leave_behind=bool(fault and fault.leave_behind))
        return json_response(vm, 201, {"Azure-AsyncOperation": self._op_url(sub, location, op, api_version)})

    def _delete_vm(self, request: Request, sub: str, name: str, api_version: str) -> Response:
        vm = self.vms.get(name)
        if vm is None:
            return Response(status=204)
        vm["properties"]["provisioningState"] = "Deleting"
        op = self._start_op("delete", name, None)
        url = self._op_url(sub, vm["location"], op, api_version)
        return Response(status=202, headers={"Azure-AsyncOperation": url, "Location": url})

    def _nic(self, method: str, sub: str, rg: str, name: str, body: Any) -> Response:
        if method == "PUT":
            configs = (body or {}).get("properties", {}).get("ipConfigurations", [])
            subnet = configs[0].get("properties", {}).get("subnet", {}).get("id") if configs else None
            if subnet not in self.subnets:
                return _error(
                    400,
                    "InvalidResourceReference",
                    f"Resource {subnet} referenced by resource was not found.",
                )
            nic = {
                "id": f"/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Network/networkInterfaces/{name}",
                "name": name,
                "location": body.get("location"),
                "tags": body.get("tags", {}),
                "properties": {**body.get("properties", {}), "provisioningState": "Succeeded"},
            }
            self.nics[name] = nic
            return json_response(nic, 201)
        if method == "GET":
            return json_response(self.nics[name]) if name in self.nics else _not_found("networkInterfaces", name, rg)
        if method == "DELETE":
            if name not in self.nics:
                return Response(status=204)
            if any(self._nic_names(vm) & {name} for vm in self.vms.values()):
                return _error(400, "NicInUse", f"Network Interface {name} is used by existing resource.")
            del self.nics[name]
            return Response(status=200)
        return _error(405, "MethodNotAllowed", method)

    def _list(self, rg: str) -> Response:
        for op_id, pending in list(self._ops.items()):
            if pending.verb == "delete":
                self._finish(op_id)
        return json_response({"value": [vm for _, vm in sorted(self.vms.items())]})

    def _poll(self, op_id: str) -> Response:
        if op_id not in self._op_status:
            return _error(404, "NotFound", f"operation {op_id} not found")
        pending = self._ops.get(op_id)
        if pending is not None:
            pending.polls -= 1
            if pending.polls <= 0:
                self._finish(op_id)
        return json_response(self._op_status[op_id])

    # ---- helpers ---------------------------------------------------------------------

    def _start_op(self, verb: str, name: str, error: dict[str, Any] | None, leave_behind: bool = False) -> str:
        op_id = str(uuid.uuid4())
        self._ops[op_id] = _Pending(self.operation_polls, verb, name, error, leave_behind)
        self._op_status[op_id] = {
            "name": op_id,
            "status": "InProgress",
            "startTime": datetime.now(UTC).isoformat(),
        }
        return op_id

    def _finish(self, op_id: str) -> None:
        pending = self._ops.pop(op_id)
        status = self._op_status[op_id]
        status["endTime"] = datetime.now(UTC).isoformat()
        vm = self.vms.get(pending.name)
        if pending.error is not None:
            status.update(status="Failed", error=pending.error)
            if vm is not None:
                if pending.leave_behind:
                    vm["properties"]["provisioningState"] = "Failed"
                else:
                    self._remove_vm(pending.name)
            return
        status["status"] = "Succeeded"
        if vm is None:
            return
        if pending.verb == "create":
            vm["properties"]["provisioningState"] = "Succeeded"
        else:
            self._remove_vm(pending.name)

    def _remove_vm(self, name: str) -> None:
        vm = self.vms.pop(name)
        self.custom_data.pop(name, None)
        props = vm["properties"]
        if props.get("storageProfile", {}).get("osDisk", {}).get("deleteOption") == "Delete":
            self.disks.discard(f"{name}_OsDisk")
        for ref in props.get("networkProfile", {}).get("networkInterfaces", []):
            if ref.get("properties", {}).get("deleteOption") == "Delete":
                self.nics.pop(ref["id"].rsplit("/", 1)[-1], None)

    @staticmethod
    def _nic_names(vm: dict[str, Any]) -> set[str]:
        refs = vm["properties"].get("networkProfile", {}).get("networkInterfaces", [])
        return {r["id"].rsplit("/", 1)[-1] for r in refs}

    def _validate_vm(self, body: Any) -> str | None:
        """What ARM refuses with 400 among the fields the driver sends."""
        if not isinstance(body, dict) or not body.get("location"):
            return "Required parameter 'location' is missing (null)."
        props = body.get("properties", {})
        if not props.get("hardwareProfile", {}).get("vmSize"):
            return "Required parameter 'hardwareProfile.vmSize' is missing (null)."
        refs = props.get("networkProfile", {}).get("networkInterfaces", [])
        if not refs or any(r.get("id", "").rsplit("/", 1)[-1] not in self.nics for r in refs):
            return "Network interface referenced by the virtual machine was not found."
        custom = props.get("osProfile", {}).get("customData", "")
        try:
            base64.b64decode(custom, validate=True)
        except (binascii.Error, ValueError):
            return "Custom data in OSProfile must be in Base64 encoding."
        linux = props.get("osProfile", {}).get("linuxConfiguration", {})
        if linux.get("disablePasswordAuthentication") and not linux.get("ssh", {}).get("publicKeys"):
            return "Authentication using either SSH or by user name and password must be enabled."
        priority = props.get("priority", "Regular")
        if priority == "Spot":
            if props.get("evictionPolicy") not in ("Delete", "Deallocate"):
                return "Eviction policy must be specified for Spot priority."
            price = props.get("billingProfile", {}).get("maxPrice", -1)
            if price != -1 and price <= 0:
                return "The value of parameter 'billingProfile.maxPrice' is invalid."
        elif props.get("evictionPolicy") or props.get("billingProfile"):
            return "Eviction policy and max price can be set only for Spot priority."
        return None

    def _take_fault(self) -> AzureFault | None:
        for fault in self.faults:
            if fault.times > 0:
                if fault.after > 0:
                    fault.after -= 1
                    continue
                fault.times -= 1
                self.faults = [f for f in self.faults if f.times > 0]
                return fault
        return None

    def _op_url(self, sub: str, location: str, op_id: str, api_version: str) -> str:
        return (
            f"{self.url}/subscriptions/{sub}/providers/Microsoft.Compute/locations/{location}"
            f"/operations/{op_id}?api-version={api_version}"
        )


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Response:
    return json_response({"error": {"code": code, "message": message}}, status, headers)


def _not_found(kind: str, name: str, rg: str) -> Response:
    return _error(
        404,
        "ResourceNotFound",
        f"The Resource 'Microsoft.Compute/{kind}/{name}' under resource group '{rg}' was not found.",
    )
