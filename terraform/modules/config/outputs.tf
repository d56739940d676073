output "yaml" {
  description = "autoscaler.yaml for the control plane (no secrets: the database URL comes from the environment)."
  value       = yamlencode(local.config)
}

output "config" {
  description = "The same configuration as an object (for tests and for modules that add to it)."
  value       = local.config
}

output "policy_files" {
  description = "Policy files to place in policy_dir on the control plane host."
  value       = var.policy_files
}
