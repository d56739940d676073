# Cloud only: the control plane on AWS and two burst pools (spot first, on-demand
# fallback) for one team's GPU queue.
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
  default = "us-east-1"
}

variable "vpc_id" {
  type = string
}

variable "private_subnet_ids" {
  type = list(string)
}

variable "certificate_arn" {
  type = string
}

variable "control_plane_image" {
  type = string
}

variable "agent_ami_id" {
  type        = string
  description = "AMI built from agent_image/packer/aws.pkr.hcl."
}

module "autoscaler" {
  source = "../../modules/aws"

  deployment          = "gpu-burst"
  vpc_id              = var.vpc_id
  subnet_ids          = var.private_subnet_ids
  api_allowed_cidrs   = ["10.0.0.0/8"]
  certificate_arn     = var.certificate_arn
  control_plane_image = var.control_plane_image

  teams  = [{ name = "research", description = "Model training" }]
  queues = [{ name = "train", pools = ["g5-spot", "g5-on-demand"], teams = ["research"] }]
  pools = [
    {
      name           = "g5-spot"
      provider       = "aws"
      region         = var.region
      image          = var.agent_ami_id
      capacity_types = ["spot"]
      max_instances  = 16
      instance_types = [{ name = "g5.xlarge", gpus = 1, gpu_type = "A10G", cpus = 4, memory_mb = 16384 }]
    },
    {
      name           = "g5-on-demand"
      provider       = "aws"
      region         = var.region
      image          = var.agent_ami_id
      capacity_types = ["on_demand"]
      max_instances  = 4
      instance_types = [{ name = "g5.xlarge", gpus = 1, gpu_type = "A10G", cpus = 4, memory_mb = 16384 }]
    },
  ]
}

output "api_url" {
  value = module.autoscaler.api_url
}

output "admin_token_parameter" {
  value = module.autoscaler.admin_token_parameter
}
