"""AWS instance identity verification: the driver's hook, and registration on a live
server whose AWS pool requires a signed identity document (both databases).

A locally generated key pair and self-signed certificate stand in for the region's
public AWS certificate (tests/fakes/aws_identity.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.config import AutoscalerConfig, parse_config
from autoscaler.state.models import SecurityEvent
from providers.aws.identity import verifier_from_options, verify_document
from providers.identity import IdentityRefused, identity_verifier
from tests.conftest import TEST_CONFIG, LiveServer, issue_token, make_context
from tests.fakes.aws_identity import ACCOUNT, REGION, FakeAwsSigner

POOL = "aws-pool"


@pytest.fixture(scope="module")
def signer() -> FakeAwsSigner:
    return FakeAwsSigner()


def aws_config(signer: FakeAwsSigner, **options: Any) -> AutoscalerConfig:
    base = yaml.safe_load(TEST_CONFIG)
    base["pools"].append(
        {
            "name": POOL,
            "provider": "aws",
            "region": REGION,
            "instance_types": [
                {
                    "name": "g5.xlarge",
                    "gpus": 1,
                    "gpu_type": "A10G",
                    "cpus": 4,
                    "memory_mb": 16384,
                    "on_demand_price": 1.0,
                }
            ],
            "options": {"identity_certificate": signer.certificate_pem, "identity_account_id": ACCOUNT, **options},
        }
    )
    return parse_config(yaml.safe_dump(base), Path("test.yaml"))


def test_the_driver_hook_verifies_documents_signed_by_the_certificate(signer: FakeAwsSigner, tmp_path: Path) -> None:
    verify = identity_verifier("aws", {"identity_certificate": signer.certificate_pem}, REGION)
    assert verify is not None
    ok = verify(signer.evidence("i-0abc"))
    assert (ok.provider, ok.instance_id, ok.account, ok.region) == ("aws", "i-0abc", ACCOUNT, REGION)
    # The certificate may be a file path, as the docs say.
    cert = tmp_path / "aws.pem"
    cert.write_text(signer.certificate_pem)
    from_file = verifier_from_options({"identity_certificate": str(cert), "identity_account_id": ACCOUNT}, REGION)
    assert from_file is not None and from_file(signer.evidence("i-0abc")).instance_id == "i-0abc"

    evidence = signer.evidence("i-0abc")
    tampered = {**evidence, "document": evidence["document"].replace("i-0abc", "i-0evil")}
    with pytest.raises(IdentityRefused, match="does not verify"):
        verify(tampered)
    with pytest.raises(IdentityRefused, match="does not verify"):
        verify(FakeAwsSigner().evidence("i-0abc"))  # signed by another key
    with pytest.raises(IdentityRefused, match="not base64"):
        verify({**evidence, "signature": "%%%"})
    with pytest.raises(IdentityRefused, match="needs 'document' and 'signature'"):
        verify({"document": evidence["document"]})
    with pytest.raises(IdentityRefused, match="account"):
        from_file(signer.evidence("i-0abc", accountId="999999999999"))
    with pytest.raises(IdentityRefused, match="region"):
        verify(signer.evidence("i-0abc", region="eu-west-1"))
    # Nothing to verify without a certificate, and no hook for the other clouds yet.
    assert identity_verifier("aws", {}, REGION) is None
    assert identity_verifier("gcp", {"identity_certificate": "x"}, "europe-west4") is None
    assert identity_verifier("azure", {}, "westeurope") is None
    assert verify_document(evidence["document"], evidence["signature"], signer.key.public_key()).instance_id == "i-0abc"


@pytest.fixture
def server(signer: FakeAwsSigner, sessions: sessionmaker[Session]) -> Iterator[LiveServer]:
    live = LiveServer(make_context(aws_config(signer), sessions)).start()
    yield live
    live.stop()


def register(server: LiveServer, instance_id: str, identity: dict[str, str] | None) -> httpx.Response:
    token = issue_token(server.ctx, "join", pool=POOL, ttl=timedelta(minutes=30))
    body: dict[str, Any] = {"hostname": instance_id, "instance_id": instance_id, "provider": "aws", "pool": POOL}
    if identity is not None:
        body["identity"] = identity
    return httpx.post(
        f"{server.url}/api/v1/workers/register", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=10
    )


def test_registration_in_a_verifying_pool_needs_the_signed_identity(server: LiveServer, signer: FakeAwsSigner) -> None:
    assert register(server, "i-0good", signer.evidence("i-0good")).status_code == 201
    missing = register(server, "i-0none", None)
    assert missing.status_code == 403 and "identity document" in missing.text
    # A join token copied off the machine, replayed from elsewhere with that machine's id
    # but another instance's (genuine) document.
    other = register(server, "i-0victim", signer.evidence("i-0attacker"))
    assert other.status_code == 403 and "not the claimed i-0victim" in other.text
    forged = register(server, "i-0forged", FakeAwsSigner().evidence("i-0forged"))
    assert forged.status_code == 403 and "does not verify" in forged.text
    with server.ctx.sessions() as s:
        rows = list(s.scalars(select(SecurityEvent).order_by(SecurityEvent.id)))
    assert [(e.kind, e.instance_id) for e in rows] == [
        ("registration_refused", "i-0none"),
        ("registration_refused", "i-0victim"),
        ("registration_refused", "i-0forged"),
    ]
    assert all(e.detail.startswith("identity verification:") for e in rows)
    # Refused registrations did not spend their tokens' pools' other machines: the good one is live.
    admin = issue_token(server.ctx, "admin")
    workers = httpx.get(f"{server.url}/api/v1/workers", headers={"Authorization": f"Bearer {admin}"}).json()
    assert [w["instance_id"] for w in workers] == ["i-0good"]
