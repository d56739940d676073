variable "deployment" {
  type        = string
  description = "Deployment name: owner tag on every agent VM and prefix of every resource."
}

variable "location" {
  type = string
}

variable "resource_group_name" {
  type        = string
  description = "Existing resource group for the control plane; agent VMs are launched into agent_resource_group_name."
}

variable "agent_resource_group_name" {
  type        = string
  description = "Resource group agent VMs are created in; the control plane's rights are scoped to it."
}

variable "subnet_id" {
  type        = string
  description = "Subnet of the control plane host."
}

variable "agent_subnet_id" {
  type        = string
  default     = null
  description = "Full resource id of the subnet agent VMs' NICs join; default: subnet_id."
}

variable "db_subnet_id" {
  type        = string
  description = "Subnet delegated to Microsoft.DBforPostgreSQL/flexibleServers."
}

variable "private_dns_zone_id" {
  type        = string
  description = "Private DNS zone (*.postgres.database.azure.com) linked to the VNet."
}

variable "control_plane_image" {
  type = string
}

variable "control_plane_vm_size" {
  type    = string
  default = "Standard_B2s"
}

variable "public_url" {
  type        = string
  description = "HTTPS URL agents use for the API (Application Gateway or proxy in front)."
}

variable "admin_ssh_public_key" {
  type        = string
  description = "SSH public key for the host's admin user (password login is disabled)."
}

variable "agent_ssh_public_key" {
  type        = string
  default     = null
  description = "SSH public key put on agent VMs (Azure requires one; password login is off); default: admin_ssh_public_key."
}

variable "db_sku" {
  type    = string
  default = "GP_Standard_D2ds_v5"
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

variable "tags" {
  type    = map(string)
  default = {}
}
