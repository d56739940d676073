# Agent image for Azure (azure-arm): Ubuntu 24.04 + NVIDIA driver + the agent + its unit.
#   packer build -var subscription_id=... -var resource_group=images -var location=eastus \
#     -var agent_wheel=dist/gpu_autoscaler-0.1.0-py3-none-any.whl agent_image/packer/azure.pkr.hcl
# Authentication comes from the environment (az login, or ARM_* for a service principal),
# never from this file. docs/deploy.md ("Build the agent image") has the whole procedure.

variable "subscription_id" {
  type = string
}

variable "resource_group" {
  type        = string
  description = "Resource group that receives the managed image."
}

variable "location" {
  type = string
}

variable "vm_size" {
  type = string
  # A GPU size, so the driver installer can match the GPU.
  default = "Standard_NC4as_T4_v3"
}

variable "image_publisher" {
  type    = string
  default = "Canonical"
}

variable "image_offer" {
  type    = string
  default = "ubuntu-24_04-lts"
}

variable "image_sku" {
  type    = string
  default = "server"
}

variable "agent_wheel" {
  type        = string
  default     = ""
  description = "Path of a gpu_autoscaler wheel built from this repository (python -m build --wheel). Wins over agent_version."
}

variable "agent_version" {
  type        = string
  default     = ""
  description = "Install gpu-autoscaler==VERSION from the package index instead of a wheel."
}

variable "install_container_toolkit" {
  type        = bool
  default     = true
  description = "Require the NVIDIA container toolkit (tasks that run containers)."
}

variable "container_toolkit_apt_source" {
  type        = string
  default     = ""
  description = "apt source line for NVIDIA's container toolkit repository, when the base image lacks both."
}

variable "container_toolkit_key_url" {
  type    = string
  default = ""
}

variable "deployment" {
  type        = string
  default     = "autoscaler"
  description = "Deployment name, recorded as a tag so images of different deployments are told apart."
}

locals {
  # Sortable and unique per build, so pools can pin an exact image.
  stamp = formatdate("YYYYMMDDhhmmss", timestamp())
}

source "azure-arm" "agent" {
  subscription_id = var.subscription_id
  # Credentials from the Azure CLI login; nothing secret in the template.
  use_azure_cli_auth = true

  os_type         = "Linux"
  image_publisher = var.image_publisher
  image_offer     = var.image_offer
  image_sku       = var.image_sku
  location        = var.location
  vm_size         = var.vm_size
  os_disk_size_gb = 100

  managed_image_name                = "${var.deployment}-agent-${local.stamp}"
  managed_image_resource_group_name = var.resource_group

  azure_tags = {
    "autoscaler-image"      = "agent"
    "autoscaler-deployment" = var.deployment
  }
}

build {
  sources = ["source.azure-arm.agent"]

  provisioner "shell" {
    inline = ["mkdir -p /tmp/autoscaler-agent"]
  }

  provisioner "file" {
    sources     = ["${path.root}/../files/autoscaler-agent.service", "${path.root}/../files/autoscaler-agent-exit", "${path.root}/../files/autoscaler-imds-guard", "${path.root}/../files/autoscaler-imds-guard.service"]
    destination = "/tmp/autoscaler-agent/"
  }

  provisioner "file" {
    # An empty agent_wheel uploads the (empty) placeholder directory instead; the
    # install script then falls back to agent_version.
    source      = var.agent_wheel != "" ? var.agent_wheel : "${path.root}/../files/no-wheel/"
    destination = "/tmp/autoscaler-agent/"
  }

  provisioner "shell" {
    execute_command = "sudo -E sh -c '{{ .Vars }} {{ .Path }}'"
    environment_vars = [
      "INSTALL_CONTAINER_TOOLKIT=${var.install_container_toolkit}",
      "CONTAINER_TOOLKIT_APT_SOURCE=${var.container_toolkit_apt_source}",
      "CONTAINER_TOOLKIT_KEY_URL=${var.container_toolkit_key_url}",
    ]
    script = "${path.root}/../scripts/install-nvidia.sh"
  }

  provisioner "shell" {
    execute_command  = "sudo -E sh -c '{{ .Vars }} {{ .Path }}'"
    environment_vars = ["AGENT_VERSION=${var.agent_version}", "STAGING=/tmp/autoscaler-agent"]
    script           = "${path.root}/../scripts/install-agent.sh"
  }

  # Azure images must be generalized, or every VM started from one keeps the build
  # VM's identity and user account.
  provisioner "shell" {
    execute_command = "sudo -E sh -c '{{ .Vars }} {{ .Path }}'"
    inline          = ["/usr/sbin/waagent -force -deprovision+user", "sync"]
    skip_clean      = true
  }
}
