variable "deployment" {
  type        = string
  description = "Deployment name: owner label on every agent VM and prefix of agent VM names."
}

variable "project_id" {
  type = string
}

variable "region" {
  type = string
}

variable "zone" {
  type = string
}

variable "network" {
  type        = string
  description = "VPC network self link; needs private services access for Cloud SQL."
}

variable "subnetwork" {
  type = string
}

variable "control_plane_image" {
  type        = string
  description = "Container image of the control plane (Artifact Registry path with tag)."
}

variable "control_plane_machine_type" {
  type    = string
  default = "e2-small"
}

variable "public_url" {
  type        = string
  description = "HTTPS URL agents use for the API (the load balancer or proxy you put in front)."
}

variable "db_tier" {
  type    = string
  default = "db-custom-1-3840"
}

variable "deletion_protection" {
  type    = bool
  default = true
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
  type    = any
  default = []
}

variable "policy_files" {
  type    = map(string)
  default = {}
}

variable "labels" {
  type    = map(string)
  default = {}
}

variable "sql_proxy_image" {
  type        = string
  description = "Cloud SQL Auth Proxy v2 container image (Google publishes it; mirror it into your Artifact Registry)."
}

variable "gcloud_image" {
  type        = string
  description = "A Google Cloud CLI container image (its slim variant suffices), used once to store the admin token."
}
