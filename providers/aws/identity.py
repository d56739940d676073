"""AWS instance identity: the document IMDS serves and its RSA-SHA256 signature.

`GET /latest/dynamic/instance-identity/document` is a JSON object (instanceId,
accountId, region, ...); `.../signature` is its base64 RSA-SHA256 (PKCS#1 v1.5)
signature, verifiable with the public AWS certificate of the region
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/regions-certs.html). The server
verifies it when a pool's options set `identity_certificate` (the PEM, inline or a
file path); `identity_account_id` additionally pins the account.

What it proves: the caller could read IMDS of that instance, which AWS signed. It does
not tell the agent apart from a root process on the same instance (both can read
IMDS); it stops a join token copied off the machine from registering elsewhere.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from providers.base import import_extra
from providers.identity import IdentityRefused, IdentityVerifier, VerifiedIdentity


def _load_public_key(certificate_pem: bytes) -> Any:
    x509 = import_extra("cryptography.x509", extra="aws", package="cryptography")
    try:
        return x509.load_pem_x509_certificate(certificate_pem).public_key()
    except ValueError as exc:
        raise ValueError(f"identity_certificate is not a PEM X.509 certificate: {exc}") from None


@lru_cache(maxsize=16)
def _cached_key(certificate: str) -> Any:
    text = certificate.strip()
    pem = text.encode() if text.startswith("-----BEGIN") else Path(text).expanduser().read_bytes()
    return _load_public_key(pem)


def verify_document(
    document: str,
    signature_b64: str,
    public_key: Any,
    *,
    account_id: str | None = None,
    region: str | None = None,
) -> VerifiedIdentity:
    """Check the signature and the pinned fields; the verified identity or IdentityRefused."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding

    try:
        signature = base64.b64decode("".join(signature_b64.split()), validate=True)
    except (binascii.Error, ValueError):
        raise IdentityRefused("the identity signature is not base64") from None
    try:
        public_key.verify(signature, document.encode(), padding.PKCS1v15(), hashes.SHA256())
    except InvalidSignature:
        raise IdentityRefused("the instance identity document's signature does not verify") from None
    try:
        doc = json.loads(document)
    except json.JSONDecodeError:
        raise IdentityRefused("the instance identity document is not JSON") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("instanceId"), str):
        raise IdentityRefused("the instance identity document names no instanceId")
    if account_id is not None and doc.get("accountId") != account_id:
        raise IdentityRefused(f"the instance belongs to account {doc.get('accountId')!r}, not {account_id!r}")
    if region is not None and doc.get("region") != region:
        raise IdentityRefused(f"the instance is in region {doc.get('region')!r}, not {region!r}")
    return VerifiedIdentity(
        provider="aws", instance_id=doc["instanceId"], account=doc.get("accountId"), region=doc.get("region")
    )


def verifier_from_options(options: Mapping[str, Any], region: str | None) -> IdentityVerifier | None:
    certificate = options.get("identity_certificate")
    if not certificate:
        return None
    key = _cached_key(str(certificate))
    account = options.get("identity_account_id")
    pinned_region = region if region and region != "local" else None

    def verify(evidence: Mapping[str, str]) -> VerifiedIdentity:
        document, signature = evidence.get("document"), evidence.get("signature")
        if not document or not signature:
            raise IdentityRefused("the AWS identity evidence needs 'document' and 'signature'")
        return verify_document(
            document, signature, key, account_id=str(account) if account else None, region=pinned_region
        )

    return verify
