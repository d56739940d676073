"""The OPA REST engine against a protocol-faithful double on 127.0.0.1.

The double answers like OPA's Data API: `POST /v1/data/<path>` with `{"input": ...}`
gives `{"result": ..., "decision_id": ...}`, no `result` key for an undefined
document, and `{"code", "message"}` bodies for errors. Its decision is computed by
the real shipped Rego (rego-cpp), so the test checks the wire, not a canned answer.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from autoscaler.policy.bundle import load_bundle, shipped_policy_dir
from autoscaler.policy.cases import complete_input
from autoscaler.policy.engines import OpaEngine
from autoscaler.policy.rego import RegoRuntime
from tests.policy.helpers import DEMO_DATA, NOW


class OpaDouble:
    def __init__(self) -> None:
        bundle = load_bundle(shipped_policy_dir(), with_cases=False, data_dir=DEMO_DATA)
        self.rego = RegoRuntime()
        self.rego.load(bundle.modules, bundle.data, "autoscaler/decision")
        self.mode = "ok"
        self.requests: list[dict] = []
        double = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, status: int, body: dict) -> None:
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                double.requests.append({"path": self.path, "body": body})
                path = self.path.split("?")[0]
                if double.mode == "timeout":
                    time.sleep(1.0)
                if double.mode == "400" or not isinstance(body.get("input"), dict):
                    return self._send(400, {"code": "invalid_parameter", "message": "input must be an object"})
                if double.mode == "500":
                    return self._send(500, {"code": "internal_error", "message": "eval_conflict_error"})
                if path != "/v1/data/autoscaler/decision" or double.mode == "undefined":
                    return self._send(200, {"decision_id": str(uuid.uuid4())})  # undefined document
                value, _ = double.rego.evaluate(body["input"])
                out = {"result": value, "decision_id": str(uuid.uuid4())}
                if "provenance" in self.path:
                    out["provenance"] = {"version": "0.70.0", "bundles": {"finops": {"revision": "r42"}}}
                return self._send(200, out)

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: object, client_address: object) -> None:
                pass  # the client hung up on a deliberately slow answer

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def opa():
    double = OpaDouble()
    yield double
    double.close()


@pytest.fixture
def engine(opa):
    opa.mode = "ok"
    eng = OpaEngine(opa.url, timeout_s=0.5)
    yield eng
    eng.close()


INPUT = complete_input({"now": NOW, "teams": [{"name": "research", "month_to_date_usd": 20500, "forecast_usd": 22000}]})


def test_result_is_parsed_with_its_decision_id_and_bundle_revision(opa, engine):
    result = engine.evaluate(INPUT)
    assert result.error is None
    assert result.decision.team("research").drain is True
    assert uuid.UUID(result.decision_id)
    assert result.revision == "opa:finops@r42"
    sent = opa.requests[-1]
    assert sent["path"].startswith("/v1/data/autoscaler/decision")
    assert sent["body"]["input"]["teams"][0]["name"] == "research"


def test_undefined_document_fails_safe_and_says_why(opa, engine):
    opa.mode = "undefined"
    result = engine.evaluate(INPUT)
    assert result.decision.fail_safe and result.decision.team("research").may_scale_up is False
    assert "undefined document for data.autoscaler.decision" in result.error


def test_wrong_package_is_an_undefined_document(opa):
    eng = OpaEngine(opa.url, package="finops.main", timeout_s=0.5)
    try:
        result = eng.evaluate(INPUT)
        assert result.decision.fail_safe and "data.finops.main.decision" in result.error
        assert opa.requests[-1]["path"].startswith("/v1/data/finops/main/decision")
    finally:
        eng.close()


@pytest.mark.parametrize(
    ("mode", "text"),
    [
        ("400", "HTTP 400: invalid_parameter: input must be an object"),
        ("500", "HTTP 500: internal_error: eval_conflict_error"),
    ],
)
def test_http_errors_fail_safe_with_opas_message(opa, engine, mode, text):
    opa.mode = mode
    result = engine.evaluate(INPUT)
    assert result.decision.fail_safe and text in result.error


def test_timeout_fails_safe(opa, engine):
    opa.mode = "timeout"
    started = time.monotonic()
    result = engine.evaluate(INPUT)
    assert time.monotonic() - started < 0.95
    assert result.decision.fail_safe and "did not answer within 0.5 s" in result.error


def test_unreachable_server_fails_safe():
    eng = OpaEngine("http://127.0.0.1:9", timeout_s=0.5)
    try:
        result = eng.evaluate(INPUT)
        assert result.decision.fail_safe and "unreachable" in result.error
    finally:
        eng.close()
