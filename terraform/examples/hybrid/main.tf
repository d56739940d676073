# Hybrid: on-prem GPU servers (static pool, used first, never terminated) with AWS
# burst pools behind them, and FinOps budgets kept in this repository's policies/.
terraform {
  required_version = ">= 1.7"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.40, < 7.0"
    }
  }
}

provider "aws" {
  region = var.region
}

variable "region" {
  type    = string
  default = "eu-west-1"
}

variable "vpc_id" {
  type = string
}

variable "private_subnet_ids" {
  type = list(string)
}

variable "onprem_cidrs" {
  type        = list(string)
  description = "Networks of the on-prem GPU servers (reach the API over VPN or Direct Connect)."
}

variable "certificate_arn" {
  type = string
}

variable "control_plane_image" {
  type = string
}

variable "agent_ami_id" {
  type = string
}

variable "policy_dir" {
  type        = string
  default     = null
  description = "Your copy of the repository's policies/ directory; default: the repository's own."
}

locals {
  policy_dir = coalesce(var.policy_dir, "${path.module}/../../../policies")
}

module "autoscaler" {
  source = "../../modules/aws"

  deployment          = "hybrid"
  vpc_id              = var.vpc_id
  subnet_ids          = var.private_subnet_ids
  api_allowed_cidrs   = var.onprem_cidrs
  certificate_arn     = var.certificate_arn
  control_plane_image = var.control_plane_image

  teams = [{ name = "vision" }, { name = "nlp" }]
  queues = [
    # On-prem first; the cloud only when the racks are full.
    { name = "gpu", pools = ["onprem-a100", "burst-spot", "burst-on-demand"], priority = 10 },
    { name = "batch", pools = ["onprem-a100", "burst-spot"], teams = ["vision"] },
  ]
  pools = [
    { name = "onprem-a100", provider = "static", region = "dc1", max_instances = 8 },
    {
      name           = "burst-spot"
      provider       = "aws"
      region         = var.region
      image          = var.agent_ami_id
      capacity_types = ["spot"]
      max_instances  = 20
      idle_timeout_s = 300
      instance_types = [{ name = "g5.2xlarge", gpus = 1, gpu_type = "A10G", cpus = 8, memory_mb = 32768 }]
    },
    {
      name           = "burst-on-demand"
      provider       = "aws"
      region         = var.region
      image          = var.agent_ami_id
      capacity_types = ["on_demand"]
      max_instances  = 4
      instance_types = [{ name = "g5.2xlarge", gpus = 1, gpu_type = "A10G", cpus = 8, memory_mb = 32768 }]
    },
  ]

  # FinOps edit data/budgets.yaml in the policy directory; `terraform plan` shows the
  # change and apply rolls it out (the control plane host is replaced, state stays).
  policy_files = {
    for f in setunion(fileset(local.policy_dir, "*.rego"), fileset(local.policy_dir, "data/*.yaml")) :
    f => file("${local.policy_dir}/${f}")
  }
}

output "api_url" {
  value = module.autoscaler.api_url
}

output "admin_token_parameter" {
  value = module.autoscaler.admin_token_parameter
}
