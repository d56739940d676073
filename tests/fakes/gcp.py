"""A local Compute Engine REST fake for the real google-cloud-compute client.

It reproduces what the driver relies on, as the real API does it:
- `POST /compute/v1/projects/P/zones/Z/instances?requestId=U` answers a zone operation
  (numeric `id`, `status` RUNNING); the same requestId returns the *same* operation
  and creates nothing (GCP's idempotency); a name already in use answers 409
  `alreadyExists`; requestId must be a UUID, names and labels must match GCP's rules,
  spot requires `onHostMaintenance=TERMINATE` and no automatic restart.
- `POST .../operations/OP/wait` and `GET .../operations/OP` finish the operation after
  `operation_polls` polls; errors arrive in the finished operation
  (`error.errors[].code`, `errorDetails[].quotaInfo`, `httpErrorStatusCode`).
- `GET /compute/v1/projects/P/aggregated/instances?filter=labels.K = "V"` lists per zone
  (`warning` NO_RESULTS_ON_PAGE for empty zones).
- `DELETE .../zones/Z/instances/N` answers an operation; unknown names answer 404
  `notFound`. Deletion completes when the operation is polled or at the next listing.
- `resourcePolicies` on an insert must name policies that exist
  (`add_resource_policy`; 404 `notFound` otherwise, as the real API); a compact policy
  (collocation COLLOCATED) holds VMs of one zone only (400 `invalid` for another).
- Faults: `fail_insert(...)` arms a synchronous HTTP error or an asynchronous operation
  error for the next inserts (optionally in one zone only).
"""

from __future__ import annotations

import itertools
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from werkzeug.wrappers import Request, Response

from tests.fakes.cloud_rest import RestFake, json_response

_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
_BASE = "https://www.googleapis.com/compute/v1"
_INSTANCES = re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/instances(?:/([^/]+))?$")
_OPERATION = re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/operations/([^/]+?)(/wait)?$")
_AGGREGATED = re.compile(r"^/compute/v1/projects/([^/]+)/aggregated/instances$")
_FILTER_TERM = re.compile(r'labels\.([a-z0-9_-]+)\s*(=|eq)\s*"?([^"\s)]*)"?')


@dataclass
class GcpFault:
    code: str
    message: str
    http_status: int
    # Synchronous: the insert's HTTP answer is the error (body.error.errors[].reason = code).
    # Asynchronous: the insert is accepted and its operation finishes with the error.
    sync: bool
    zone: str | None = None
    quota_metric: str = ""
    times: int = 1
    # Let this many matching inserts through first (to fail the n-th VM of a launch).
    after: int = 0


class GcpComputeFake(RestFake):
    def __init__(self, zones: tuple[str, ...] = ("us-central1-a", "us-central1-b", "us-central1-c")) -> None:
        super().__init__()
        self.zones = zones
        self.instances: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.operations: dict[str, dict[str, Any]] = {}
        self.by_request_id: dict[str, str] = {}
        self.faults: list[GcpFault] = []
        self.operation_polls = 1
        # "projects/P/regions/R/resourcePolicies/N" -> {"collocation": ..., "zone": first member's}
        self.resource_policies: dict[str, dict[str, Any]] = {}
        self._ids = itertools.count(1000)
        # Per operation: polls left, the instance key it acts on, the error it ends with.
        self._pending: dict[str, tuple[int, tuple[str, str, str], str, dict[str, Any] | None]] = {}

    # ---- test knobs ------------------------------------------------------------------

    def fail_insert(
        self,
        code: str,
        message: str = "",
        *,
        http_status: int = 503,
        sync: bool = False,
        zone: str | None = None,
        quota_metric: str = "",
        times: int = 1,
        after: int = 0,
    ) -> None:
        self.faults.append(
            GcpFault(code, message or f"{code} (fake)", http_status, sync, zone, quota_metric, times, after)
        )

    def add_resource_policy(self, project: str, region: str, name: str, collocation: str = "COLLOCATED") -> str:
        """Create a group placement policy (as `gcloud compute resource-policies create
        group-placement` does); returns its resource path."""
        path = f"projects/{project}/regions/{region}/resourcePolicies/{name}"
        with self.lock:
            self.resource_policies[path] = {"collocation": collocation, "zone": None}
        return path

    def reset(self) -> None:
        with self.lock:
            self.resource_policies.clear()
            self.instances.clear()
            self.operations.clear()
            self.by_request_id.clear()
            self.faults.clear()
            self._pending.clear()
            self.requests.clear()
            self.operation_polls = 1

    def live(self) -> list[dict[str, Any]]:
        with self.lock:
            return [dict(i) for i in self.instances.values()]

    # ---- HTTP ------------------------------------------------------------------------

    def handle(self, request: Request, body: Any) -> Response:
        path = request.path
        if m := _OPERATION.match(path):
            return self._poll(m.group(1), m.group(2), m.group(3))
        if m := _AGGREGATED.match(path):
            return self._aggregated(m.group(1), request.args.get("filter", ""))
        if m := _INSTANCES.match(path):
            project, zone, name = m.groups()
            if zone not in self.zones:
                return _error(404, "notFound", f"The resource 'projects/{project}/zones/{zone}' was not found")
            if request.method == "POST" and name is None:
                return self._insert(project, zone, request.args.get("requestId"), body)
            if request.method == "GET" and name:
                inst = self.instances.get((project, zone, name))
                if inst is None:
                    return _not_found(project, zone, name)
                return json_response(inst)
            if request.method == "DELETE" and name:
                return self._delete(project, zone, name, request.args.get("requestId"))
        return _error(404, "notFound", f"no such fake route: {request.method} {path}")

    def _insert(self, project: str, zone: str, request_id: str | None, body: Any) -> Response:
        if request_id is not None:
            try:
                if uuid.UUID(request_id).int == 0:
                    raise ValueError
            except ValueError:
                return _error(400, "invalid", f"Invalid value for field 'requestId': '{request_id}'.")
            if request_id in self.by_request_id:
                return json_response(self.operations[self.by_request_id[request_id]])
        problem = _validate_instance(body, zone)
        if problem:
            return _error(400, "invalid", problem)
        policies, policy_error = self._policies(body, zone)
        if policy_error is not None:
            return policy_error
        key = (project, zone, body["name"])
        fault = self._take_fault(zone)
        if fault is not None and fault.sync:
            return _error(fault.http_status, fault.code, fault.message)
        if key in self.instances:
            return _error(
                409,
                "alreadyExists",
                f"The resource 'projects/{project}/zones/{zone}/instances/{key[2]}' already exists",
            )
        op = self._operation(project, zone, "insert", key[2])
        error: dict[str, Any] | None = None
        if fault is not None:
            details = []
            if fault.quota_metric:
                details.append({"quotaInfo": {"metricName": fault.quota_metric, "limitName": fault.quota_metric}})
            error = {
                "error": {"errors": [{"code": fault.code, "message": fault.message, "errorDetails": details}]},
                "httpErrorStatusCode": fault.http_status,
                "httpErrorMessage": "SERVICE UNAVAILABLE" if fault.http_status == 503 else "FORBIDDEN",
            }
        else:
            self.instances[key] = self._resource(project, zone, body)
            for policy in policies:
                policy["zone"] = policy["zone"] or zone
        self._pending[op["name"]] = (self.operation_polls, key, "insert", error)
        if request_id is not None:
            self.by_request_id[request_id] = op["name"]
        return json_response(op)

    def _delete(self, project: str, zone: str, name: str, request_id: str | None) -> Response:
        if request_id is not None and request_id in self.by_request_id:
            return json_response(self.operations[self.by_request_id[request_id]])
        inst = self.instances.get((project, zone, name))
        if inst is None:
            return _not_found(project, zone, name)
        inst["status"] = "STOPPING"
        op = self._operation(project, zone, "delete", name)
        self._pending[op["name"]] = (self.operation_polls, (project, zone, name), "delete", None)
        if request_id is not None:
            self.by_request_id[request_id] = op["name"]
        return json_response(op)

    def _poll(self, project: str, zone: str, name: str) -> Response:
        op = self.operations.get(name)
        if op is None:
            return _error(
                404,
                "notFound",
                f"The resource 'projects/{project}/zones/{zone}/operations/{name}' was not found",
            )
        if name in self._pending:
            polls, key, verb, error = self._pending[name]
            if polls <= 1:
                self._finish(name)
            else:
                self._pending[name] = (polls - 1, key, verb, error)
        return json_response(op)

    def _finish(self, op_name: str) -> None:
        _, key, verb, error = self._pending.pop(op_name)
        op = self.operations[op_name]
        op.update(status="DONE", progress=100, endTime=_now())
        if error:
            op.update(error)
        elif verb == "insert" and key in self.instances:
            self.instances[key]["status"] = "RUNNING"
        elif verb == "delete":
            self.instances.pop(key, None)

    def _aggregated(self, project: str, filter_expr: str) -> Response:
        for op_name, (_, _, verb, _) in list(self._pending.items()):
            if verb == "delete":
                self._finish(op_name)
        terms = [(k, v) for k, _, v in _FILTER_TERM.findall(filter_expr)]
        if filter_expr and not terms:
            return _error(400, "invalid", f"Invalid value for field 'filter': '{filter_expr}'.")
        items: dict[str, Any] = {}
        for zone in self.zones:
            found = [
                inst
                for (p, z, _), inst in sorted(self.instances.items())
                if p == project and z == zone and all(inst.get("labels", {}).get(k) == v for k, v in terms)
            ]
            items[f"zones/{zone}"] = (
                {"instances": found}
                if found
                else {"warning": {"code": "NO_RESULTS_ON_PAGE", "message": "There are no results for scope"}}
            )
        return json_response(
            {
                "kind": "compute#instanceAggregatedList",
                "id": f"projects/{project}/aggregated/instances",
                "items": items,
            }
        )

    # ---- helpers ---------------------------------------------------------------------

    def _policies(self, body: Any, zone: str) -> tuple[list[dict[str, Any]], Response | None]:
        """The resource policies an insert names, or the error the real API answers."""
        found = []
        for ref in body.get("resourcePolicies", []) if isinstance(body, dict) else []:
            path = str(ref).removeprefix(_BASE + "/")
            policy = self.resource_policies.get(path)
            if policy is None:
                return [], _error(404, "notFound", f"The resource '{path}' was not found")
            if policy["collocation"] == "COLLOCATED" and policy["zone"] not in (None, zone):
                return [], _error(
                    400,
                    "invalid",
                    f"Invalid value for field 'resource.resourcePolicies': '{path}'. A compact placement "
                    f"policy holds VMs of one zone ({policy['zone']}), not {zone}.",
                )
            found.append(policy)
        return found, None

    def _take_fault(self, zone: str) -> GcpFault | None:
        for fault in self.faults:
            if fault.times > 0 and fault.zone in (None, zone):
                if fault.after > 0:
                    fault.after -= 1
                    continue
                fault.times -= 1
                self.faults = [f for f in self.faults if f.times > 0]
                return fault
        return None

    def _operation(self, project: str, zone: str, verb: str, target: str) -> dict[str, Any]:
        op_id = next(self._ids)
        name = f"operation-{op_id}-{uuid.uuid4().hex[:12]}"
        op = {
            "kind": "compute#operation",
            "id": str(op_id),
            "name": name,
            "zone": f"{_BASE}/projects/{project}/zones/{zone}",
            "operationType": verb,
            "targetLink": f"{_BASE}/projects/{project}/zones/{zone}/instances/{target}",
            "status": "RUNNING",
            "progress": 0,
            "insertTime": _now(),
            "selfLink": f"{_BASE}/projects/{project}/zones/{zone}/operations/{name}",
        }
        self.operations[name] = op
        return op

    def _resource(self, project: str, zone: str, body: dict[str, Any]) -> dict[str, Any]:
        n = next(self._ids)
        interfaces = [dict(i, networkIP=f"10.128.0.{n % 250 + 2}") for i in body.get("networkInterfaces", [])]
        return {
            **body,
            "kind": "compute#instance",
            "id": str(n * 7919),
            "zone": f"{_BASE}/projects/{project}/zones/{zone}",
            "machineType": f"{_BASE}/projects/{project}/{body['machineType']}",
            "status": "PROVISIONING",
            "creationTimestamp": _now(),
            "networkInterfaces": interfaces,
            "selfLink": f"{_BASE}/projects/{project}/zones/{zone}/instances/{body['name']}",
        }


def _validate_instance(body: Any, zone: str) -> str | None:
    """What the real API refuses with 400 among the fields the driver sends."""
    if not isinstance(body, dict):
        return "Required field 'resource' not specified"
    name = body.get("name", "")
    if not _NAME.match(name):
        return (
            f"Invalid value for field 'resource.name': '{name}'. Must be a match of regex "
            "'(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'"
        )
    if not str(body.get("machineType", "")).startswith(f"zones/{zone}/machineTypes/"):
        return f"Invalid value for field 'resource.machineType': '{body.get('machineType')}'."
    for key, value in body.get("labels", {}).items():
        if not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
            return f"Invalid value for field 'resource.labels': '{key}={value}'."
    boot = [d for d in body.get("disks", []) if d.get("boot")]
    if len(boot) != 1:
        return "Exactly one boot disk must be specified."
    sched = body.get("scheduling", {})
    if sched.get("provisioningModel") == "SPOT":
        if sched.get("onHostMaintenance") != "TERMINATE" or sched.get("automaticRestart", True):
            return "Spot VMs require onHostMaintenance=TERMINATE and automaticRestart=false."
        if sched.get("instanceTerminationAction") not in ("STOP", "DELETE"):
            return "Invalid value for field 'resource.scheduling.instanceTerminationAction'."
    if body.get("guestAccelerators") and sched.get("onHostMaintenance") != "TERMINATE":
        return "Instances with guest accelerators do not support live migration."
    return None


def _error(status: int, reason: str, message: str) -> Response:
    domain = "usageLimits" if reason in ("quotaExceeded", "rateLimitExceeded") else "global"
    return json_response(
        {
            "error": {
                "code": status,
                "message": message,
                "errors": [{"message": message, "domain": domain, "reason": reason}],
            }
        },
        status,
    )


def _not_found(project: str, zone: str, name: str) -> Response:
    return _error(404, "notFound", f"The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found")


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")
