output "api_url" {
  value = var.public_url
}

output "admin_token_secret" {
  description = "Secret Manager secret holding the admin API token (gcloud secrets versions access latest --secret ...)."
  value       = google_secret_manager_secret.admin_token.id
}

output "agent_service_account" {
  value = google_service_account.agent.email
}

output "config_yaml" {
  value = module.config.yaml
}
