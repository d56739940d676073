"""Structure checks for the GCP and Azure modules, which cannot be `terraform validate`d
offline (no google/azurerm provider mirror): parsed with python-hcl2, they are held to
the rules that matter: scoped identities, no passwords, consistent references, and
pool settings the providers actually accept.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import hcl2
import pytest

from tests.deploy.conftest import TERRAFORM

MODULES = ["gcp", "azure"]


def _unq(v: Any) -> Any:
    """python-hcl2 >= 7 keeps HCL quotes on keys and strings; drop them."""
    if isinstance(v, dict):
        return {_unq(k): _unq(x) for k, x in v.items() if k not in ("__is_block__", "__comments__")}
    if isinstance(v, list):
        return [_unq(x) for x in v]
    if isinstance(v, str) and len(v) >= 2 and v[0] == v[-1] == '"':
        return v[1:-1]
    return v


def _load(module: str) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for f in sorted((TERRAFORM / "modules" / module).glob("*.tf")):
        with f.open() as fh:
            for key, items in _unq(hcl2.load(fh)).items():
                merged.setdefault(key, []).extend(items if isinstance(items, list) else [items])
    return merged


def _resources(doc: dict[str, Any], rtype: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for block in doc.get("resource", []):
        out.update(block.get(rtype, {}))
    return out


def _text(module: str) -> str:
    return "\n".join(f.read_text() for f in sorted((TERRAFORM / "modules" / module).glob("*.tf")))


@pytest.mark.parametrize("module", MODULES)
def test_every_variable_used_is_declared_and_every_declared_one_used(module: str) -> None:
    doc, text = _load(module), _text(module)
    declared = {name for block in doc["variable"] for name in block}
    used = set(re.findall(r"\bvar\.([a-z_][a-z0-9_]*)", text))
    assert used <= declared, f"undeclared: {used - declared}"
    assert declared <= used, f"declared but unused: {declared - used}"


@pytest.mark.parametrize("module", MODULES)
def test_templates_receive_every_placeholder(module: str) -> None:
    text = _text(module)
    for call in re.finditer(r'templatefile\("\$\{path\.module\}/([^"]+)", \{(.*?)\n\s*\}\)', text, re.S):
        template = (TERRAFORM / "modules" / module / call.group(1)).read_text()
        given = set(re.findall(r"^\s*([a-z_]+)\s*=", call.group(2), re.M))
        loops = re.findall(r"%\{ for (\w+), (\w+) in ([a-z_]+)", template)
        bound = {n for k, v, _ in loops for n in (k, v)}
        wanted = (set(re.findall(r"\$\{(?:base64encode\()?([a-z_]+)", template)) - bound) | {c for *_, c in loops}
        assert wanted <= given, f"{call.group(1)} needs {wanted - given}"


@pytest.mark.parametrize("module", MODULES)
def test_no_password_or_static_credential(module: str) -> None:
    text = _text(module) + "".join(p.read_text() for p in (TERRAFORM / "modules" / module).glob("templates/*"))
    for pattern in (
        r"\bpassword\s*=",
        r"administrator_password",
        r"client_secret",
        r"\bcredentials\s*=",
        r"private_key",
    ):
        assert not re.search(pattern, text), f"{module}: {pattern}"


def test_gcp_pool_options_are_what_the_gcp_provider_accepts() -> None:
    from providers.gcp.settings import GcpOptions

    config = _load("gcp")["module"][0]["config"]
    assert config["pool_options_provider"] == "gcp"
    assert set(config["pool_options"]) <= set(GcpOptions.model_fields)
    assert config["pool_options"]["name_prefix"] == "${local.name}"  # the IAM condition keys on it


def test_azure_pool_options_are_what_the_azure_provider_accepts() -> None:
    from providers.azure.settings import AzureOptions

    config = _load("azure")["module"][0]["config"]
    assert config["pool_options_provider"] == "azure"
    assert set(config["pool_options"]) <= set(AzureOptions.model_fields)
    # The config loader refuses an Azure pool without the options AzureOptions requires.
    required = {name for name, f in AzureOptions.model_fields.items() if f.is_required()}
    assert required == {"subscription_id", "resource_group", "subnet_id", "ssh_public_key"}
    assert required <= set(config["pool_options"])


def test_gcp_control_plane_may_only_touch_its_own_vms() -> None:
    doc = _load("gcp")
    members = _resources(doc, "google_project_iam_member")
    launcher = members["launcher"]
    cond = launcher["condition"][0]["expression"]
    assert "resource.name.startsWith" in cond and "local.agent_names" in cond
    assert 'agent_names = "projects/${var.project_id}/zones/${var.zone}/instances/${local.name}-"' in _text("gcp")
    roles = {m["role"] for m in members.values()}
    assert not roles & {"roles/owner", "roles/editor", "roles/compute.admin", "roles/compute.instanceAdmin.v1"}
    # Join tokens travel in instance metadata: agents need no project role, and the
    # control plane no Secret Manager rights beyond the admin token's own secret.
    agent = [m for m in members.values() if "google_service_account.agent" in m["member"]]
    assert agent == []
    assert "roles/secretmanager.admin" not in roles


def test_gcp_database_is_private_and_passwordless() -> None:
    sql = _resources(_load("gcp"), "google_sql_database_instance")["this"]
    ip = sql["settings"][0]["ip_configuration"][0]
    assert ip["ipv4_enabled"] is False and ip["ssl_mode"] == "ENCRYPTED_ONLY"
    user = _resources(_load("gcp"), "google_sql_user")["control_plane"]
    assert user["type"] == "CLOUD_IAM_SERVICE_ACCOUNT"


def test_azure_identities_are_scoped() -> None:
    assignments = _resources(_load("azure"), "azurerm_role_assignment")
    by_principal: dict[str, list[tuple[str, str]]] = {}
    for a in assignments.values():
        role = a.get("role_definition_name") or a["role_definition_id"]
        by_principal.setdefault(a["principal_id"], []).append((role, a["scope"]))
    # Agent VMs carry no identity (the join token comes in customData); only the
    # control plane holds roles.
    assert set(by_principal) == {"${azurerm_user_assigned_identity.control_plane.principal_id}"}
    cp = dict(by_principal["${azurerm_user_assigned_identity.control_plane.principal_id}"])
    assert cp["Virtual Machine Contributor"] == "${data.azurerm_resource_group.agents.id}"
    assert cp["${azurerm_role_definition.subnet_joiner.role_definition_resource_id}"] == "${local.agent_subnet_id}"
    assert all("subscription" not in scope for scope in cp.values())
    joiner = _resources(_load("azure"), "azurerm_role_definition")["subnet_joiner"]
    assert joiner["permissions"][0]["actions"] == [
        "Microsoft.Network/virtualNetworks/subnets/join/action",
        "Microsoft.Network/virtualNetworks/subnets/read",
    ]
    assert joiner["assignable_scopes"] == ["${local.agent_subnet_id}"]


def test_azure_database_and_vault_are_private() -> None:
    doc = _load("azure")
    pg = _resources(doc, "azurerm_postgresql_flexible_server")["this"]
    assert pg["public_network_access_enabled"] is False
    assert pg["authentication"][0]["password_auth_enabled"] is False
    kv = _resources(doc, "azurerm_key_vault")["this"]
    assert kv["public_network_access_enabled"] is False and kv["enable_rbac_authorization"] is True


def test_parser_sees_a_broken_module(tmp_path: Path) -> None:
    # Guards the checks above: a syntax error must not parse into an empty, passing doc.
    bad = tmp_path / "bad.tf"
    bad.write_text('resource "x" "y" {\n  a = \n}\n')
    with pytest.raises(Exception), bad.open() as fh:  # noqa: B017 - any parse error will do
        hcl2.load(fh)
