# Provider-free: runs anywhere `terraform` runs.
variables {
  deployment = "demo"
  public_url = "https://gpu.example.com"
  teams      = [{ name = "vision" }]
  queues     = [{ name = "gpu", pools = ["burst", "onprem"] }]
  pools = [
    { name = "burst", provider = "aws", max_instances = 4, instance_types = [{ name = "g5.xlarge", gpus = 1, spot_price = 0.5 }] },
    { name = "onprem", provider = "static", options = { note = "rack 3" } },
  ]
  pool_options          = { subnets = ["subnet-a"], instance_profile = "demo-agent" }
  pool_options_provider = "aws"
}

run "unset_attributes_are_left_to_the_control_plane" {
  command = plan
  assert {
    condition     = !contains(keys(yamldecode(output.yaml).pools[0]), "min_instances") && yamldecode(output.yaml).pools[0].max_instances == 4
    error_message = "Unset pool attributes must be omitted (autoscaler.yaml refuses nulls), set ones kept."
  }
  assert {
    condition     = yamldecode(output.yaml).pools[0].instance_types == [{ name = "g5.xlarge", gpus = 1, spot_price = 0.5 }]
    error_message = "Instance types must keep only the attributes that were set."
  }
}

run "provider_settings_reach_only_their_pools" {
  command = plan
  assert {
    condition     = yamldecode(output.yaml).pools[0].options == { subnets = ["subnet-a"], instance_profile = "demo-agent" }
    error_message = "AWS pools must get the module's settings."
  }
  assert {
    condition     = yamldecode(output.yaml).pools[1].options == { note = "rack 3" }
    error_message = "Other pools keep only their own options."
  }
  assert {
    condition     = yamldecode(output.yaml).server.tls_terminated_upstream && yamldecode(output.yaml).server.host == "0.0.0.0"
    error_message = "The control plane listens on all addresses behind a TLS-terminating load balancer."
  }
}

run "bad_deployment_name_is_refused" {
  command = plan
  variables {
    deployment = "Bad_Name"
  }
  expect_failures = [var.deployment]
}

run "policy_file_names_cannot_escape_the_policy_dir" {
  command = plan
  variables {
    policy_files = { "../etc/passwd" = "x" }
  }
  expect_failures = [var.policy_files]
}
