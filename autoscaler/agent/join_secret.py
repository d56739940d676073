"""Fetch a join token named by reference (`join_token_ref` in the bootstrap file).

Keeping only a reference in user-data means the secret never sits in plain text in
the VM's metadata (a known weakness of the closest peer). Fetching needs the cloud's
SDK and the VM's identity, so each backend imports its SDK lazily and a missing SDK
is a one-line error naming the extra to install.
"""

from __future__ import annotations

from collections.abc import Callable

from autoscaler.agent.errors import AgentError
from autoscaler.agent.settings import TokenRef
from autoscaler.errors import MissingExtra


def _aws_ssm(name: str) -> str:
    try:
        import boto3
    except ImportError:
        raise MissingExtra("aws", "boto3") from None
    try:
        reply = boto3.client("ssm").get_parameter(Name=name, WithDecryption=True)
    except Exception as exc:  # botocore raises many unrelated classes; all mean "no token"
        raise AgentError(f"cannot read join token from AWS SSM parameter {name!r}: {exc}") from None
    return str(reply["Parameter"]["Value"]).strip()


def _not_built(kind: str, extra: str) -> Callable[[str], str]:
    def fetch(name: str) -> str:
        raise AgentError(
            f"join_token_ref kind {kind!r} ({name!r}) is not supported by this agent build yet; "
            "write join_token in the bootstrap file or pass --join-token "
            f"(see docs/agent.md, extra '{extra}')"
        )

    return fetch


FETCHERS: dict[str, Callable[[str], str]] = {
    "aws-ssm": _aws_ssm,
    "gcp-secret": _not_built("gcp-secret", "gcp"),
    "azure-keyvault": _not_built("azure-keyvault", "azure"),
}


def fetch_join_token(ref: TokenRef) -> str:
    token = FETCHERS[ref.kind](ref.name)
    if not token:
        raise AgentError(f"the {ref.kind} secret {ref.name!r} is empty; store the join token there")
    return token
