# The control plane on Azure: a Linux VM running the control plane container, Azure
# Database for PostgreSQL flexible server (private, Entra ID login: no password), Key
# Vault for the admin token, and the control plane's user-assigned managed identity (VM
# contributor on the agent resource group only). Agent VMs get no identity: an agent's
# one-time join token comes in its customData (docs/deploy.md). No azurerm provider
# mirror exists here:
# checked by fmt, checkov and structure tests (tests/deploy/test_terraform_structure.py).

data "azurerm_client_config" "current" {}

data "azurerm_resource_group" "agents" {
  name = var.agent_resource_group_name
}

locals {
  name            = var.deployment
  agent_subnet_id = coalesce(var.agent_subnet_id, var.subnet_id)
  tags            = merge(var.tags, { "autoscaler-deployment" = local.name })
}

module "config" {
  source = "../config"

  deployment   = var.deployment
  public_url   = var.public_url
  teams        = var.teams
  queues       = var.queues
  pools        = var.pools
  policy_files = var.policy_files

  # Only keys providers/azure/settings.py knows (it refuses others and requires these
  # four; tests/deploy builds every pool of the rendered file with the real driver).
  pool_options_provider = "azure"
  pool_options = {
    subscription_id = data.azurerm_client_config.current.subscription_id
    resource_group  = var.agent_resource_group_name
    subnet_id       = local.agent_subnet_id
    # Azure requires a key for a Linux VM with password login disabled; nobody needs
    # to log in to an agent, so the host's admin key is the default.
    ssh_public_key = coalesce(var.agent_ssh_public_key, var.admin_ssh_public_key)
  }
}

resource "azurerm_user_assigned_identity" "control_plane" {
  name                = "${local.name}-control-plane"
  location            = var.location
  resource_group_name = var.resource_group_name
  tags                = local.tags
}

# VM Contributor on the agent resource group only: the control plane can create and
# delete VMs there and nowhere else. Keep that group for this deployment's agents.
resource "azurerm_role_assignment" "control_plane_vms" {
  scope                = data.azurerm_resource_group.agents.id
  role_definition_name = "Virtual Machine Contributor"
  principal_id         = azurerm_user_assigned_identity.control_plane.principal_id
}

# The agent NIC joins the agent subnet, which usually sits in the network team's
# resource group, outside the one above: a custom role with only the join action, on
# that one subnet.
resource "azurerm_role_definition" "subnet_joiner" {
  name              = "${local.name}-autoscaler-subnet-joiner"
  scope             = local.agent_subnet_id
  description       = "Attach agent NICs of ${local.name} to the agent subnet."
  assignable_scopes = [local.agent_subnet_id]
  permissions {
    actions = [
      "Microsoft.Network/virtualNetworks/subnets/join/action",
      "Microsoft.Network/virtualNetworks/subnets/read",
    ]
  }
}

resource "azurerm_role_assignment" "control_plane_joins_agent_subnet" {
  scope              = local.agent_subnet_id
  role_definition_id = azurerm_role_definition.subnet_joiner.role_definition_resource_id
  principal_id       = azurerm_user_assigned_identity.control_plane.principal_id
}

resource "azurerm_key_vault" "this" {
  #checkov:skip=CKV_AZURE_109:the control plane reaches the vault over the VNet; a private endpoint is recommended (docs/deploy.md) but needs a DNS zone this module does not own
  #checkov:skip=CKV2_AZURE_32:same as above: private endpoint left to the network owner
  name                          = substr(replace("${local.name}-as-kv", "_", "-"), 0, 24)
  location                      = var.location
  resource_group_name           = var.resource_group_name
  tenant_id                     = data.azurerm_client_config.current.tenant_id
  sku_name                      = "standard"
  enable_rbac_authorization     = true
  purge_protection_enabled      = true
  soft_delete_retention_days    = 30
  public_network_access_enabled = false
  network_acls {
    default_action = "Deny"
    bypass         = "AzureServices"
  }
  tags = local.tags
}

resource "azurerm_role_assignment" "control_plane_secrets" {
  scope                = azurerm_key_vault.this.id
  role_definition_name = "Key Vault Secrets Officer"
  principal_id         = azurerm_user_assigned_identity.control_plane.principal_id
}

resource "azurerm_postgresql_flexible_server" "this" {
  #checkov:skip=CKV2_AZURE_57:VNet integration (delegated subnet, private DNS zone, public access off) keeps the server private; a private endpoint would be a second way in
  name                          = "${local.name}-autoscaler"
  location                      = var.location
  resource_group_name           = var.resource_group_name
  version                       = "16"
  sku_name                      = var.db_sku
  storage_mb                    = 32768
  delegated_subnet_id           = var.db_subnet_id
  private_dns_zone_id           = var.private_dns_zone_id
  public_network_access_enabled = false
  backup_retention_days         = 7
  geo_redundant_backup_enabled  = true
  zone                          = "1"
  high_availability {
    mode = "ZoneRedundant"
  }
  authentication {
    active_directory_auth_enabled = true
    password_auth_enabled         = false
    tenant_id                     = data.azurerm_client_config.current.tenant_id
  }
  tags = local.tags
}

resource "azurerm_postgresql_flexible_server_active_directory_administrator" "control_plane" {
  server_name         = azurerm_postgresql_flexible_server.this.name
  resource_group_name = var.resource_group_name
  tenant_id           = data.azurerm_client_config.current.tenant_id
  object_id           = azurerm_user_assigned_identity.control_plane.principal_id
  principal_name      = azurerm_user_assigned_identity.control_plane.name
  principal_type      = "ServicePrincipal"
}

resource "azurerm_postgresql_flexible_server_database" "autoscaler" {
  name      = "autoscaler"
  server_id = azurerm_postgresql_flexible_server.this.id
}

resource "azurerm_postgresql_flexible_server_configuration" "log_checkpoints" {
  name      = "log_checkpoints"
  server_id = azurerm_postgresql_flexible_server.this.id
  value     = "on"
}

resource "azurerm_network_interface" "control_plane" {
  name                = "${local.name}-control-plane"
  location            = var.location
  resource_group_name = var.resource_group_name
  ip_configuration {
    name                          = "internal"
    subnet_id                     = var.subnet_id
    private_ip_address_allocation = "Dynamic"
  }
  tags = local.tags
}

resource "azurerm_linux_virtual_machine" "control_plane" {
  name                            = "${local.name}-control-plane"
  location                        = var.location
  resource_group_name             = var.resource_group_name
  size                            = var.control_plane_vm_size
  admin_username                  = "azureuser"
  disable_password_authentication = true
  allow_extension_operations      = false
  encryption_at_host_enabled      = true
  network_interface_ids           = [azurerm_network_interface.control_plane.id]

  admin_ssh_key {
    username   = "azureuser"
    public_key = var.admin_ssh_public_key
  }

  identity {
    type         = "UserAssigned"
    identity_ids = [azurerm_user_assigned_identity.control_plane.id]
  }

  os_disk {
    caching              = "ReadWrite"
    storage_account_type = "Premium_LRS"
  }

  source_image_reference {
    publisher = "Canonical"
    offer     = "ubuntu-24_04-lts"
    sku       = "server"
    version   = "latest"
  }

  custom_data = base64gzip(templatefile("${path.module}/templates/control-plane.cloud-init.yaml.tftpl", {
    config_yaml  = module.config.yaml
    policy_files = var.policy_files
    image        = var.control_plane_image
    db_host      = azurerm_postgresql_flexible_server.this.fqdn
    db_user      = azurerm_user_assigned_identity.control_plane.name
    client_id    = azurerm_user_assigned_identity.control_plane.client_id
    vault_name   = azurerm_key_vault.this.name
  }))

  tags = local.tags
}
