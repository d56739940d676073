"""EC2 for tests: moto in server mode over real HTTP, with the two things moto lacks.

`MotoEC2` serves moto's WSGI app on 127.0.0.1 through a small middleware that

- **honours `ClientToken`** on RunInstances and CreateFleet (moto ignores it): a
  repeated token gets the first call's response replayed, as EC2 does, so an
  idempotency test can fail when the driver forgets the token;
- **injects faults**: `arm("CreateFleet", "InsufficientInstanceCapacity")` answers the
  next matching call with EC2's error XML (or, `in_body=True`, with a CreateFleet
  response carrying the error in its `errorSet`, which is how an instant fleet
  reports capacity errors);
- **models placement groups** (`tests/fakes/aws_placement.py`; moto 5 has none);
- **records calls** (action and form parameters) so a test can read what the driver
  really sent, e.g. the user-data.

Reuse: `from tests.fakes.aws import moto_ec2_server, moto_ec2  # noqa: F401` in a
conftest makes the fixtures available (the server starts once per session; each test
gets a fresh fault list and call log, and isolates its instances with `unique_owner()`).
"""

from __future__ import annotations

import itertools
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from io import BytesIO
from typing import Any
from urllib.parse import parse_qs
from xml.sax.saxutils import escape

import pytest

from tests.fakes.aws_placement import ACTIONS as PLACEMENT_ACTIONS
from tests.fakes.aws_placement import PlacementError, PlacementGroups

REGION = "us-east-1"
# Dummy credentials: moto accepts anything; botocore only needs some to sign.
TEST_CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


@dataclass
class Fault:
    action: str
    code: str
    message: str
    times: int | None = 1
    status: int = 400
    in_body: bool = False
    match: Callable[[dict[str, str]], bool] | None = None
    # Answer with an empty result instead of an error (a listing that lags a launch).
    empty: bool = False


@dataclass
class EC2Call:
    action: str
    params: dict[str, str]
    status: int = 200


@dataclass
class _State:
    faults: list[Fault] = field(default_factory=list)
    calls: list[EC2Call] = field(default_factory=list)
    tokens: dict[tuple[str, str], tuple[str, list[tuple[str, str]], bytes]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


def error_xml(code: str, message: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Response><Errors><Error><Code>{escape(code)}</Code><Message>{escape(message)}</Message>"
        "</Error></Errors><RequestID>fault-injected</RequestID></Response>"
    ).encode()


def fleet_error_xml(code: str, message: str, params: dict[str, str]) -> bytes:
    lifecycle = "spot" if params.get("TargetCapacitySpecification.DefaultTargetCapacityType") == "spot" else "on-demand"
    itype = params.get("LaunchTemplateConfigs.1.Overrides.1.InstanceType", "")
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<CreateFleetResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
        "<requestId>fault-injected</requestId><fleetId>fleet-fault</fleetId>"
        "<errorSet><item>"
        f"<errorCode>{escape(code)}</errorCode><errorMessage>{escape(message)}</errorMessage>"
        f"<lifecycle>{lifecycle}</lifecycle>"
        f"<launchTemplateAndOverrides><overrides><instanceType>{escape(itype)}</instanceType></overrides>"
        "</launchTemplateAndOverrides>"
        "</item></errorSet><fleetInstanceSet/></CreateFleetResponse>"
    ).encode()


class EC2Middleware:
    """The WSGI layer in front of moto (see the module docstring)."""

    IDEMPOTENT_ACTIONS = ("RunInstances", "CreateFleet", "CreateLaunchTemplate")

    def __init__(self, app: WsgiApp) -> None:
        self.app = app
        self.state = _State()
        self.placement = PlacementGroups(alive=_moto_instance_alive)

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        environ["wsgi.input"] = BytesIO(body)
        params = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True).items()}
        action = params.get("Action", "")
        if not action:
            return self.app(environ, start_response)
        with self.state.lock:
            call = EC2Call(action, params)
            self.state.calls.append(call)
            fault = self._take_fault(action, params)
            token = params.get("ClientToken")
            replay = self.state.tokens.get((action, token)) if token else None
        if fault is not None:
            if fault.empty:
                out = (
                    f'<{action}Response xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
                    f"<requestId>lagging</requestId><reservationSet/></{action}Response>"
                ).encode()
                start_response("200 OK", [("Content-Type", "text/xml"), ("Content-Length", str(len(out)))])
            elif fault.in_body:
                out = fleet_error_xml(fault.code, fault.message, params)
                start_response("200 OK", [("Content-Type", "text/xml"), ("Content-Length", str(len(out)))])
            else:
                call.status = fault.status
                out = error_xml(fault.code, fault.message)
                start_response(
                    f"{fault.status} Fault", [("Content-Type", "text/xml"), ("Content-Length", str(len(out)))]
                )
            return [out]
        if replay is not None:
            status, headers, out = replay
            start_response(status, headers)
            return [out]
        group: str | None = None
        try:
            if action in PLACEMENT_ACTIONS:
                return _reply(start_response, "200 OK", self.placement.handle(action, params))
            if action == "RunInstances":
                group = self.placement.check_launch(params, _launch_zone(params))
        except PlacementError as exc:
            call.status = 400
            return _reply(start_response, "400 Bad Request", error_xml(exc.code, exc.message))
        captured: dict[str, Any] = {}

        def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            captured["status"], captured["headers"] = status, headers
            return start_response(status, headers, exc_info) if exc_info else start_response(status, headers)

        out = b"".join(self.app(environ, capture))
        call.status = int(str(captured.get("status", "200")).split()[0])
        if group is not None and call.status == 200:
            ids = re.findall(r"<instanceId>(i-[0-9a-f]+)</instanceId>", out.decode("utf-8", "replace"))
            zones = re.findall(r"<availabilityZone>([a-z0-9-]+)</availabilityZone>", out.decode("utf-8", "replace"))
            self.placement.joined(group, zones[0] if zones else None, ids)
        if token and action in self.IDEMPOTENT_ACTIONS and call.status == 200:
            with self.state.lock:
                self.state.tokens[(action, token)] = (captured["status"], captured["headers"], out)
        return [out]

    def _take_fault(self, action: str, params: dict[str, str]) -> Fault | None:
        for f in self.state.faults:
            if f.action == action and f.times != 0 and (f.match is None or f.match(params)):
                if f.times is not None:
                    f.times -= 1
                return f
        return None


def _reply(start_response: StartResponse, status: str, out: bytes) -> list[bytes]:
    start_response(status, [("Content-Type", "text/xml"), ("Content-Length", str(len(out)))])
    return [out]


def _launch_zone(params: dict[str, str]) -> str | None:
    """The zone a RunInstances call asks for: its placement's, or its subnet's."""
    if params.get("Placement.AvailabilityZone"):
        return params["Placement.AvailabilityZone"]
    subnet = params.get("SubnetId")
    for backend in _region_backends() if subnet else []:
        for by_id in backend.subnets.values():
            if subnet in by_id:
                return str(by_id[subnet].availability_zone)
    return None


def _region_backends() -> list[Any]:
    """moto's EC2 backends of this region, one per account (the server is in-process)."""
    from moto.ec2.models import ec2_backends

    return [account[REGION] for account in ec2_backends.values() if REGION in account]


def _moto_instance_alive(instance_id: str) -> bool:
    for backend in _region_backends():
        inst = backend.get_instance_by_id(instance_id)
        if inst is not None:
            return str(inst.instance_state.name) != "terminated"
    return False


class MotoEC2:
    """moto's server on a free port on 127.0.0.1, behind `EC2Middleware`."""

    def __init__(self) -> None:
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import WSGIRequestHandler, make_server

        class QuietHandler(WSGIRequestHandler):
            def log_request(self, *args: Any, **kwargs: Any) -> None:
                pass  # one line per EC2 call would drown the test output

        self.middleware = EC2Middleware(DomainDispatcherApplication(create_backend_app))
        self._server = make_server("127.0.0.1", 0, self.middleware, threaded=True, request_handler=QuietHandler)
        self.port = int(self._server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> MotoEC2:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._thread.join(timeout=5)

    # ---- per-test controls --------------------------------------------------------

    def reset(self) -> None:
        """Empty moto's backends too (the next call then takes 1-2 s)."""
        import urllib.request

        urllib.request.urlopen(urllib.request.Request(f"{self.url}/moto-api/reset", method="POST"), timeout=10)
        self.clear()

    def clear(self) -> None:
        """Forget armed faults, recorded calls and remembered client tokens."""
        with self.middleware.state.lock:
            self.middleware.state.faults.clear()
            self.middleware.state.calls.clear()
            self.middleware.state.tokens.clear()

    def arm(
        self,
        action: str,
        code: str,
        message: str = "injected by the test",
        *,
        times: int | None = 1,
        status: int = 400,
        in_body: bool = False,
        match: Callable[[dict[str, str]], bool] | None = None,
    ) -> Fault:
        """Answer the next `times` calls of `action` (None = all) with this error."""
        fault = Fault(action, code, message, times, status, in_body, match)
        with self.middleware.state.lock:
            self.middleware.state.faults.append(fault)
        return fault

    def lag_listings(self, times: int = 1) -> Fault:
        """The next `times` DescribeInstances calls see nothing (eventual consistency)."""
        fault = Fault("DescribeInstances", "", "", times, empty=True)
        with self.middleware.state.lock:
            self.middleware.state.faults.append(fault)
        return fault

    def calls(self, action: str | None = None) -> list[EC2Call]:
        with self.middleware.state.lock:
            return [c for c in self.middleware.state.calls if action is None or c.action == action]

    def client(self, service: str = "ec2", **kw: Any) -> Any:
        """A plain boto3 client on this server, for a test's own setup and checks."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            service,
            region_name=REGION,
            endpoint_url=self.url,
            config=Config(retries={"mode": "standard", "total_max_attempts": 1}),
            **TEST_CREDENTIALS,
            **kw,
        )


@pytest.fixture(scope="session")
def moto_ec2_server() -> Iterator[MotoEC2]:
    server = MotoEC2().start()
    yield server
    server.stop()


@pytest.fixture
def moto_ec2(moto_ec2_server: MotoEC2) -> MotoEC2:
    """The shared server with no faults armed and an empty call log.

    The EC2 backend is not reset (a reset costs 1-2 s on the next call while moto
    rebuilds its region): isolate tests by a unique owner tag (`unique_owner()`), or
    call `reset()` where a test needs an empty account.
    """
    moto_ec2_server.clear()
    return moto_ec2_server


_owners = itertools.count(1)


def unique_owner(prefix: str = "t") -> str:
    """An owner tag no other test in this session uses."""
    return f"{prefix}{os.getpid()}-{next(_owners)}"
