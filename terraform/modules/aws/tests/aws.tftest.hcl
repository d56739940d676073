# `terraform test` with a mocked AWS provider: runs offline, creates nothing, and
# checks what matters for safety (IAM scoping, no secrets in user-data, IMDSv2) and
# that the generated autoscaler configuration carries the network and identity.

mock_provider "aws" {
  # The provider validates ARNs even when mocked; give the generated ones a real shape.
  mock_resource "aws_kms_key" {
    defaults = { arn = "arn:aws:kms:eu-west-1:123456789012:key/0000-key" }
  }
  mock_resource "aws_lb" {
    defaults = { arn = "arn:aws:elasticloadbalancing:eu-west-1:123456789012:loadbalancer/app/demo-api/1" }
  }
  mock_resource "aws_lb_target_group" {
    defaults = { arn = "arn:aws:elasticloadbalancing:eu-west-1:123456789012:targetgroup/demo-api/1" }
  }
  mock_resource "aws_iam_role" {
    defaults = { arn = "arn:aws:iam::123456789012:role/demo-agent" }
  }
  mock_resource "aws_ssm_parameter" {
    defaults = { arn = "arn:aws:ssm:eu-west-1:123456789012:parameter/demo/admin-token" }
  }
  override_data {
    target = data.aws_caller_identity.current
    values = { account_id = "123456789012" }
  }
  override_data {
    target = data.aws_region.current
    values = { name = "eu-west-1" }
  }
  override_data {
    target = data.aws_partition.current
    values = { partition = "aws" }
  }
  override_data {
    target = data.aws_ssm_parameter.al2023
    values = { value = "ami-0123456789abcdef0" }
  }
  override_resource {
    target = aws_db_instance.this
    values = {
      address            = "db.internal"
      port               = 5432
      db_name            = "autoscaler"
      master_user_secret = [{ secret_arn = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:rds!db-1", kms_key_id = "k", secret_status = "active" }]
    }
  }
  override_resource {
    target = aws_security_group.agent
    values = { id = "sg-0agent", arn = "arn:aws:ec2:eu-west-1:123456789012:security-group/sg-0agent" }
  }
  override_resource {
    target = aws_lb.api
    values = { dns_name = "internal-demo-api-1.eu-west-1.elb.amazonaws.com", arn = "arn:aws:elasticloadbalancing:eu-west-1:123456789012:loadbalancer/app/demo-api/1" }
  }
}

variables {
  deployment          = "demo"
  vpc_id              = "vpc-1"
  subnet_ids          = ["subnet-a", "subnet-b"]
  api_allowed_cidrs   = ["10.0.0.0/8"]
  certificate_arn     = "arn:aws:acm:eu-west-1:123456789012:certificate/abc"
  control_plane_image = "example.invalid/gpu-autoscaler:0.1.0"
  teams               = [{ name = "vision" }]
  queues              = [{ name = "gpu", pools = ["burst"] }]
  pools = [
    { name = "burst", provider = "aws", region = "eu-west-1", max_instances = 4 },
    { name = "onprem", provider = "static" },
  ]
  policy_files = { "budgets.json" = "{\"vision\": {\"monthly_usd\": 1000}}" }
}

run "iam_is_scoped_to_this_deployment" {
  command = apply

  assert {
    condition = alltrue([
      for s in jsondecode(aws_iam_role_policy.control_plane.policy).Statement :
      s.Condition.StringEquals["ec2:ResourceTag/autoscaler-owner"] == "demo"
      if contains(flatten([s.Action]), "ec2:TerminateInstances")
    ])
    error_message = "TerminateInstances must be conditioned on this deployment's owner tag."
  }
  assert {
    condition = length([
      for s in jsondecode(aws_iam_role_policy.control_plane.policy).Statement : s
      if contains(flatten([s.Action]), "ec2:RunInstances") && contains(flatten([s.Resource]), "arn:aws:ec2:eu-west-1:123456789012:instance/*")
      && try(s.Condition.StringEquals["aws:RequestTag/autoscaler-owner"], "") == "demo"
    ]) == 1
    error_message = "RunInstances on instances must require the owner tag in the request."
  }
  assert {
    condition = alltrue([
      for s in jsondecode(aws_iam_role_policy.control_plane.policy).Statement :
      s.Resource != "*" if anytrue([for a in flatten([s.Action]) : !startswith(a, "ec2:Describe")])
    ])
    error_message = "Only read-only EC2 Describe calls may use Resource \"*\"."
  }
  assert {
    condition = alltrue([
      for s in jsondecode(aws_iam_role_policy.control_plane.policy).Statement :
      s.Condition.StringEquals["ec2:CreateAction"] != null if contains(flatten([s.Action]), "ec2:CreateTags")
    ])
    error_message = "CreateTags must be limited to tagging at launch."
  }
  assert {
    condition     = jsondecode(aws_iam_role_policy.control_plane.policy).Statement[5].Resource == aws_iam_role.agent.arn
    error_message = "iam:PassRole must be limited to the agent role."
  }

  # launch_api "fleet" (the driver's default) creates and deletes a launch template per
  # request; both only for templates owned by this deployment.
  assert {
    condition = length([
      for s in jsondecode(aws_iam_role_policy.control_plane.policy).Statement : s
      if s.Action == "ec2:CreateLaunchTemplate" && s.Resource == "arn:aws:ec2:eu-west-1:123456789012:launch-template/*"
      && try(s.Condition.StringEquals["aws:RequestTag/autoscaler-owner"], "") == "demo"
      ]) == 1 && length([
      for s in jsondecode(aws_iam_role_policy.control_plane.policy).Statement : s
      if s.Action == "ec2:DeleteLaunchTemplate" && try(s.Condition.StringEquals["ec2:ResourceTag/autoscaler-owner"], "") == "demo"
    ]) == 1
    error_message = "The fleet launch path needs owner-scoped CreateLaunchTemplate and DeleteLaunchTemplate."
  }
  assert {
    condition = length([
      for s in jsondecode(aws_iam_role_policy.control_plane.policy).Statement : s
      if anytrue([for a in flatten([s.Action]) : startswith(a, "ssm:")]) && s.Resource != "arn:aws:ssm:eu-west-1:123456789012:parameter/demo/admin-token"
    ]) == 0
    error_message = "The control plane may touch only the admin-token parameter in SSM (join tokens travel in user-data)."
  }
}

run "control_plane_host_carries_no_secret" {
  command = apply

  assert {
    condition     = startswith(output.control_plane_cloud_init, "#cloud-config")
    error_message = "user_data must be a cloud-config document."
  }
  assert {
    condition = (
      !strcontains(lower(output.control_plane_cloud_init), "password=")
      && !strcontains(output.control_plane_cloud_init, "AUTOSCALER_DATABASE_URL=postgres")
      && strcontains(output.control_plane_cloud_init, "secretsmanager get-secret-value")
    )
    error_message = "The database password must be fetched at start, never written into user_data."
  }
  assert {
    condition     = base64gzip(output.control_plane_cloud_init) == aws_instance.control_plane.user_data_base64
    error_message = "The host must boot with exactly the reviewed cloud-config (gzipped)."
  }
  assert {
    condition     = aws_instance.control_plane.metadata_options[0].http_tokens == "required"
    error_message = "The control plane host must require IMDSv2."
  }
  assert {
    condition     = aws_instance.control_plane.root_block_device[0].encrypted
    error_message = "The control plane disk must be encrypted."
  }
  assert {
    condition     = aws_db_instance.this.storage_encrypted && !aws_db_instance.this.publicly_accessible && aws_db_instance.this.manage_master_user_password
    error_message = "The database must be encrypted, private, and keep its password in Secrets Manager."
  }
  assert {
    condition     = aws_ssm_parameter.admin_token.type == "SecureString" && output.admin_token_parameter == "/demo/admin-token"
    error_message = "The admin token reference must be an encrypted SSM parameter."
  }
}

run "configuration_flows_from_terraform" {
  command = apply

  assert {
    condition     = output.api_url == "https://internal-demo-api-1.eu-west-1.elb.amazonaws.com"
    error_message = "Without domain_name the API URL is the load balancer's name over HTTPS."
  }
  assert {
    condition = (
      yamldecode(output.config_yaml).pools[0].options.instance_profile == "demo-agent"
      && yamldecode(output.config_yaml).pools[0].options.security_group_ids == ["sg-0agent"]
      && yamldecode(output.config_yaml).pools[0].options.subnets == ["subnet-a", "subnet-b"]
      && keys(yamldecode(output.config_yaml).pools[0].options) == ["instance_profile", "security_group_ids", "subnets"]
    )
    error_message = "AWS pools must receive the agent subnets, instance profile and security group, under the names providers/aws/settings.py reads."
  }
  assert {
    condition     = yamldecode(output.config_yaml).pools[1].options == {}
    error_message = "Pools of other providers must not receive AWS settings."
  }
  assert {
    condition     = yamldecode(output.config_yaml).policy.dir == "/etc/autoscaler/policies" && strcontains(output.control_plane_cloud_init, "/etc/autoscaler/policies/budgets.json")
    error_message = "Policy files must reach the host and the configuration must point at them."
  }
}

run "domain_name_sets_the_public_url" {
  command = plan
  variables {
    domain_name = "gpu.example.com"
  }
  assert {
    condition     = output.api_url == "https://gpu.example.com"
    error_message = "domain_name must become the API URL agents use."
  }
}

run "one_subnet_is_refused" {
  command = plan
  variables {
    subnet_ids = ["subnet-a"]
  }
  expect_failures = [var.subnet_ids]
}
