# Renders autoscaler.yaml from Terraform inputs, so pools, teams, queues and FinOps
# policy files change through the same review and plan as the infrastructure.
# Provider-free: every cloud module uses it, and it is tested without any provider.

locals {
  # autoscaler.yaml refuses unknown keys and nulls where a number is expected, so
  # attributes left unset are dropped and the control plane's defaults apply.
  pools = [
    for p in var.pools : merge(
      { for k, v in p : k => v if v != null && k != "instance_types" && k != "options" },
      p.instance_types == null ? {} : {
        instance_types = [for t in p.instance_types : { for k, v in t : k => v if v != null }]
      },
      {
        # A conditional cannot choose between an object and {} of another type; a
        # filtered list expanded into merge() can.
        options = merge(concat(
          [for o in [var.pool_options] : o if p.provider == var.pool_options_provider],
          [p.options == null ? {} : p.options],
        )...)
      },
    )
  ]

  config = {
    deployment = var.deployment
    server = {
      host       = "0.0.0.0"
      port       = var.port
      public_url = var.public_url
      # TLS ends at the load balancer each cloud module puts in front.
      tls_terminated_upstream = true
    }
    teams  = var.teams
    queues = var.queues
    pools  = local.pools
    policy = merge(
      { engine = var.policy_engine },
      var.opa_url == null ? {} : { opa_url = var.opa_url },
      length(var.policy_files) == 0 ? {} : { dir = var.policy_dir },
    )
    reconcile = { interval_s = var.reconcile_interval_s }
  }
}
