variable "deployment" {
  type        = string
  description = "Deployment name: the owner tag on every instance and the prefix of every cloud resource."
  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9-]{0,30}$", var.deployment))
    error_message = "deployment must be 1-31 characters of a-z, 0-9 and '-', starting with a letter or digit (it becomes part of cloud resource names)."
  }
}

variable "public_url" {
  type        = string
  description = "URL agents use to reach the API (https://...)."
  validation {
    condition     = can(regex("^https?://", var.public_url))
    error_message = "public_url must start with https:// (or http:// for a test deployment)."
  }
}

variable "port" {
  type        = number
  default     = 8080
  description = "Port the API listens on behind the load balancer."
}

variable "teams" {
  type = list(object({
    name        = string
    description = optional(string, "")
  }))
  default     = []
  description = "Teams (the unit of budgets and priorities)."
}

variable "queues" {
  type = list(object({
    name     = string
    pools    = list(string)
    priority = optional(number, 0)
    teams    = optional(list(string), [])
  }))
  default     = []
  description = "Elastic queues; each names the pools that serve it, in preference order."
  validation {
    condition     = alltrue([for q in var.queues : length(q.pools) > 0])
    error_message = "every queue needs at least one pool."
  }
}

variable "pools" {
  type = list(object({
    name     = string
    provider = string
    region   = optional(string)
    zones    = optional(list(string))
    instance_types = optional(list(object({
      name            = string
      gpus            = optional(number)
      gpu_type        = optional(string)
      cpus            = optional(number)
      memory_mb       = optional(number)
      on_demand_price = optional(number)
      spot_price      = optional(number)
    })))
    capacity_types = optional(list(string))
    min_instances  = optional(number)
    max_instances  = optional(number)
    idle_timeout_s = optional(number)
    boot_timeout_s = optional(number)
    image          = optional(string)
    labels         = optional(map(string))
    # Scalar provider settings; the cloud modules add the network and identity ones.
    options = optional(map(string))
  }))
  default     = []
  description = "Capacity pools (autoscaler.yaml `pools`); unset attributes take the control plane's defaults."
  validation {
    condition     = alltrue([for p in var.pools : contains(["aws", "gcp", "azure", "static", "slurm", "local"], p.provider)])
    error_message = "pool provider must be one of aws, gcp, azure, static, slurm, local."
  }
}

variable "pool_options" {
  # An object, not a map: values mix strings and lists.
  type        = any
  default     = {}
  description = "Provider settings the cloud module adds to every pool of its own provider (subnets, security groups, identity, join token store)."
}

variable "pool_options_provider" {
  type        = string
  default     = ""
  description = "Which pools receive pool_options (the cloud module's provider)."
}

variable "policy_engine" {
  type    = string
  default = "embedded"
  validation {
    condition     = contains(["embedded", "opa"], var.policy_engine)
    error_message = "policy_engine must be embedded or opa."
  }
}

variable "opa_url" {
  type    = string
  default = null
}

variable "policy_dir" {
  type        = string
  default     = "/etc/autoscaler/policies"
  description = "Where the control plane host receives policy_files."
}

variable "policy_files" {
  type        = map(string)
  default     = {}
  description = "The policy directory (relative name => content): Rego files and data/*.yaml such as FinOps budgets; empty = the policies shipped with the package."
  validation {
    # One directory level, as in the shipped policies/ (data/budgets.yaml); no "..".
    condition = alltrue([
      for n in keys(var.policy_files) : can(regex("^([A-Za-z0-9_-][A-Za-z0-9_.-]*/)?[A-Za-z0-9_-][A-Za-z0-9_.-]*$", n)) && !strcontains(n, "..")
    ])
    error_message = "policy_files keys must be relative file names inside the policy directory (at most one subdirectory, no '..'), e.g. budgets.rego or data/budgets.yaml."
  }
}

variable "reconcile_interval_s" {
  type    = number
  default = 15
}
