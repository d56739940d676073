# The example plans offline against a mocked AWS provider (see modules/aws/tests for
# the module's own checks).
mock_provider "aws" {
  # The provider validates ARNs even when mocked; give the generated ones a real shape.
  mock_resource "aws_kms_key" {
    defaults = { arn = "arn:aws:kms:eu-west-1:123456789012:key/0000-key" }
  }
  mock_resource "aws_lb" {
    defaults = { arn = "arn:aws:elasticloadbalancing:eu-west-1:123456789012:loadbalancer/app/x/1", dns_name = "x.elb.amazonaws.com" }
  }
  mock_resource "aws_lb_target_group" {
    defaults = { arn = "arn:aws:elasticloadbalancing:eu-west-1:123456789012:targetgroup/x/1" }
  }
  mock_resource "aws_iam_role" {
    defaults = { arn = "arn:aws:iam::123456789012:role/x" }
  }
  mock_resource "aws_ssm_parameter" {
    defaults = { arn = "arn:aws:ssm:eu-west-1:123456789012:parameter/x" }
  }
  mock_resource "aws_db_instance" {
    defaults = { master_user_secret = [{ secret_arn = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:x" }] }
  }
  override_data {
    target = module.autoscaler.data.aws_caller_identity.current
    values = { account_id = "123456789012" }
  }
  override_data {
    target = module.autoscaler.data.aws_region.current
    values = { name = "eu-west-1" }
  }
  override_data {
    target = module.autoscaler.data.aws_partition.current
    values = { partition = "aws" }
  }
  override_data {
    target = module.autoscaler.data.aws_ssm_parameter.al2023
    values = { value = "ami-0123456789abcdef0" }
  }
}

variables {
  vpc_id              = "vpc-1"
  private_subnet_ids  = ["subnet-a", "subnet-b"]
  certificate_arn     = "arn:aws:acm:eu-west-1:123456789012:certificate/abc"
  control_plane_image = "example.invalid/gpu-autoscaler:0.1.0"
  agent_ami_id        = "ami-0agent"
  onprem_cidrs        = ["192.168.0.0/16"]
}

run "on_prem_first_and_policies_shipped" {
  command = apply
  assert {
    condition     = yamldecode(module.autoscaler.config_yaml).queues[0].pools[0] == "onprem-a100"
    error_message = "The on-prem pool must come first."
  }
  assert {
    condition     = yamldecode(module.autoscaler.config_yaml).pools[0].options == {}
    error_message = "The static pool must not receive AWS settings."
  }
  assert {
    condition     = yamldecode(module.autoscaler.config_yaml).policy.dir == "/etc/autoscaler/policies"
    error_message = "The control plane must read the policies Terraform ships."
  }
  assert {
    condition     = strcontains(module.autoscaler.control_plane_cloud_init, "path: /etc/autoscaler/policies/data/budgets.yaml")
    error_message = "The FinOps budgets must reach the control plane host."
  }
}
