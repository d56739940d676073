output "api_url" {
  value = var.public_url
}

output "admin_token_secret" {
  description = "Key Vault secret holding the admin API token (az keyvault secret show --id ...)."
  value       = "${azurerm_key_vault.this.vault_uri}secrets/admin-token"
}

output "key_vault_uri" {
  value = azurerm_key_vault.this.vault_uri
}

output "config_yaml" {
  value = module.config.yaml
}
