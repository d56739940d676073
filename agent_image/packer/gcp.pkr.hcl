# Agent image for GCP (googlecompute): Ubuntu 24.04 + NVIDIA driver + the agent + its unit.
#   packer build -var project_id=my-project -var zone=us-central1-a \
#     -var agent_wheel=dist/gpu_autoscaler-0.1.0-py3-none-any.whl agent_image/packer/gcp.pkr.hcl
# docs/deploy.md ("Build the agent image") has the whole procedure.

variable "project_id" {
  type        = string
  description = "Project the image is built in and stored in."
}

variable "zone" {
  type        = string
  description = "Zone of the build VM; it must offer accelerator_type."
}

variable "machine_type" {
  type    = string
  default = "g2-standard-4"
}

variable "accelerator_type" {
  type = string
  # The build VM carries a GPU so the driver installer can match it.
  default     = "nvidia-l4"
  description = "GPU attached to the build VM (accelerator type name in the zone)."
}

variable "source_image_family" {
  type        = string
  default     = "ubuntu-2404-lts-amd64"
  description = "Base image family; install-nvidia.sh adds the driver unless the base has one."
}

variable "source_image_project_id" {
  type    = list(string)
  default = ["ubuntu-os-cloud"]
}

variable "network" {
  type    = string
  default = ""
}

variable "subnetwork" {
  type    = string
  default = ""
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

source "googlecompute" "agent" {
  project_id              = var.project_id
  zone                    = var.zone
  machine_type            = var.machine_type
  accelerator_type        = "projects/${var.project_id}/zones/${var.zone}/acceleratorTypes/${var.accelerator_type}"
  accelerator_count       = 1
  on_host_maintenance     = "TERMINATE"
  source_image_family     = var.source_image_family
  source_image_project_id = var.source_image_project_id
  network                 = var.network
  subnetwork              = var.subnetwork
  ssh_username            = "packer"
  disk_size               = 100
  disk_type               = "pd-balanced"
  image_name              = "${var.deployment}-agent-${local.stamp}"
  image_family            = "${var.deployment}-agent"
  image_labels = {
    autoscaler-image      = "agent"
    autoscaler-deployment = var.deployment
  }
  # Shielded VM: agents launched from the image may then enable secure boot.
  enable_secure_boot          = true
  enable_vtpm                 = true
  enable_integrity_monitoring = true
}

build {
  sources = ["source.googlecompute.agent"]

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
}
