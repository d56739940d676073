variable "deployment" {
  type        = string
  description = "Deployment name: owner tag on every agent instance and prefix of every resource."
}

variable "vpc_id" {
  type = string
}

variable "subnet_ids" {
  type        = list(string)
  description = "Private subnets (two or more zones) for the control plane and the database."
  validation {
    condition     = length(var.subnet_ids) >= 2
    error_message = "subnet_ids needs at least two subnets in different availability zones (RDS subnet groups and load balancers require it)."
  }
}

variable "lb_subnet_ids" {
  type        = list(string)
  default     = null
  description = "Subnets of the API load balancer (public ones for agents outside the VPC); default: subnet_ids."
}

variable "lb_internal" {
  type        = bool
  default     = true
  description = "Keep the API load balancer private to the VPC (agents and on-prem machines reach it over VPN/peering)."
}

variable "agent_subnet_ids" {
  type        = list(string)
  default     = null
  description = "Subnets agent instances launch into; default: subnet_ids."
}

variable "api_allowed_cidrs" {
  type        = list(string)
  description = "CIDR blocks allowed to reach the API on 443 (operators, on-prem agents). Agents in this module's security group are always allowed."
}

variable "certificate_arn" {
  type        = string
  description = "ACM certificate for the API load balancer's HTTPS listener."
}

variable "domain_name" {
  type        = string
  default     = null
  description = "DNS name agents use for the API (point it at the load balancer); default: the load balancer's own name."
}

variable "control_plane_image" {
  type        = string
  description = "Container image of the control plane (agent_image/docker/control-plane.Dockerfile), e.g. an ECR URI with a tag."
}

variable "control_plane_instance_type" {
  type    = string
  default = "t3.small"
}

variable "control_plane_ami_id" {
  type        = string
  default     = null
  description = "AMI of the control plane host; default: the latest Amazon Linux 2023."
}

variable "db_instance_class" {
  type    = string
  default = "db.t4g.small"
}

variable "db_allocated_storage_gb" {
  type    = number
  default = 20
}

variable "db_engine_version" {
  type    = string
  default = "16"
}

variable "db_multi_az" {
  type        = bool
  default     = true
  description = "A standby in a second zone: the queue and the fleet records live here."
}

variable "deletion_protection" {
  type        = bool
  default     = true
  description = "Protect the database and the load balancer from `terraform destroy`; turn off to tear down a test deployment."
}

variable "teams" {
  type    = any
  default = []
}

variable "queues" {
  type    = any
  default = []
}

variable "pools" {
  type        = any
  default     = []
  description = "Pools as in modules/config; aws pools get this module's subnets, security group, and instance profile."
}

variable "policy_engine" {
  type    = string
  default = "embedded"
}

variable "opa_url" {
  type    = string
  default = null
}

variable "policy_files" {
  type        = map(string)
  default     = {}
  description = "FinOps policy and data files (name => content), placed in /etc/autoscaler/policies."
}

variable "tags" {
  type    = map(string)
  default = {}
}
