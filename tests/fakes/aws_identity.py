"""A stand-in for AWS's instance identity signing: a locally generated RSA key pair and
a self-signed certificate play the region's public AWS certificate."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

ACCOUNT = "123456789012"
REGION = "us-east-1"


class FakeAwsSigner:
    def __init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Stand-in for Amazon Web Services LLC")])
        now = datetime.now(UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(days=1))
            .not_valid_after(now + timedelta(days=30))
            .sign(self.key, hashes.SHA256())
        )
        self.certificate_pem = cert.public_bytes(serialization.Encoding.PEM).decode()

    def document(self, instance_id: str, **overrides: Any) -> str:
        doc = {
            "accountId": ACCOUNT,
            "architecture": "x86_64",
            "availabilityZone": f"{REGION}a",
            "imageId": "ami-03cf127a",
            "instanceId": instance_id,
            "instanceType": "g5.xlarge",
            "pendingTime": "2026-03-10T12:00:00Z",
            "privateIp": "10.0.0.12",
            "region": REGION,
            "version": "2017-09-30",
            **overrides,
        }
        return json.dumps(doc, indent=2)

    def sign(self, document: str) -> str:
        signature = self.key.sign(document.encode(), padding.PKCS1v15(), hashes.SHA256())
        return base64.b64encode(signature).decode()

    def evidence(self, instance_id: str, **overrides: Any) -> dict[str, str]:
        doc = self.document(instance_id, **overrides)
        return {"document": doc, "signature": self.sign(doc)}
