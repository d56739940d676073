"""Verifying a machine's identity as its cloud states it, at registration.

A join token proves that the caller read the machine's bootstrap; it does not prove
which machine the caller is. Where the cloud signs a statement of the machine's
identity, the server can check the claimed instance id against it:

- **AWS**: the instance identity document and its RSA-SHA256 signature from IMDS
  (`/latest/dynamic/instance-identity/{document,signature}`), checked against the
  region's public AWS certificate. Implemented (`providers.aws.identity`); on when a
  pool sets `options.identity_certificate`.
- **GCP**: the instance identity JWT (`instance/service-accounts/default/identity`),
  signed by Google. Not implemented: no hook, evidence is ignored (docs/agent.md).
- **Azure**: attested data (`/metadata/attested/document`), PKCS#7 signed by
  Microsoft. Not implemented: no hook, evidence is ignored (docs/agent.md).

Local, Slurm and static machines have no cloud to vouch for them.

A verifier takes the evidence the agent sent (a mapping of strings) and returns the
verified identity or raises `IdentityRefused` with a one-line reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class VerifiedIdentity:
    provider: str
    instance_id: str
    account: str | None = None
    region: str | None = None


class IdentityRefused(Exception):
    """The evidence is missing, malformed, not signed by the cloud, or for another machine."""


IdentityVerifier = Callable[[Mapping[str, str]], VerifiedIdentity]


def identity_verifier(provider: str, options: Mapping[str, Any], region: str | None) -> IdentityVerifier | None:
    """The verification hook of a pool's driver, or None where there is none (or the
    pool did not turn it on)."""
    if provider == "aws":
        from providers.aws.identity import verifier_from_options

        return verifier_from_options(options, region)
    return None
