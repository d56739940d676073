output "api_url" {
  description = "URL of the API (agents, CLI and dashboard)."
  value       = local.api_url
}

output "lb_dns_name" {
  description = "Point domain_name's DNS record (CNAME/alias) here."
  value       = aws_lb.api.dns_name
}

output "admin_token_parameter" {
  description = "SSM SecureString holding the admin API token (aws ssm get-parameter --with-decryption --name ...)."
  value       = aws_ssm_parameter.admin_token.name
}

output "admin_token_parameter_arn" {
  value = aws_ssm_parameter.admin_token.arn
}

output "database_secret_arn" {
  description = "Secrets Manager secret with the database credentials (managed and rotatable by RDS)."
  value       = aws_db_instance.this.master_user_secret[0].secret_arn
}

output "agent_instance_profile" {
  value = aws_iam_instance_profile.agent.name
}

output "agent_security_group_id" {
  value = aws_security_group.agent.id
}

output "control_plane_role_arn" {
  value = aws_iam_role.control_plane.arn
}

output "config_yaml" {
  description = "The rendered autoscaler.yaml (no secrets)."
  value       = module.config.yaml
}

output "control_plane_cloud_init" {
  description = "The control plane host's cloud-config before gzip (no secrets; for review and tests)."
  value       = local.control_plane_cloud_init
}
