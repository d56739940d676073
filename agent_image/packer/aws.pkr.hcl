# Agent image for AWS (amazon-ebs): GPU-ready base + the autoscaler agent + its unit.
#   packer build -var region=us-east-1 -var agent_wheel=dist/gpu_autoscaler-0.1.0-py3-none-any.whl \
#     agent_image/packer/aws.pkr.hcl
# docs/deploy.md ("Build the agent image") has the whole procedure.

variable "region" {
  type        = string
  description = "Region the AMI is built in (copy it elsewhere with ami_regions)."
}

variable "ami_regions" {
  type        = list(string)
  default     = []
  description = "Extra regions to copy the finished AMI to."
}

variable "instance_type" {
  type = string
  # A GPU instance, so install-nvidia.sh can detect the GPU when the base lacks a driver.
  default     = "g5.xlarge"
  description = "Build instance type."
}

variable "source_ami_name" {
  type = string
  # AWS's Deep Learning Base AMI already carries the NVIDIA driver, Docker and the
  # NVIDIA container toolkit, which saves the slowest part of the build.
  default     = "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 24.04) *"
  description = "Name filter of the base AMI (newest match wins)."
}

variable "source_ami_owner" {
  type        = string
  default     = "amazon"
  description = "Owner of the base AMI."
}

variable "ssh_username" {
  type    = string
  default = "ubuntu"
}

variable "subnet_id" {
  type        = string
  default     = ""
  description = "Build in this subnet (default: the default VPC)."
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

source "amazon-ebs" "agent" {
  region        = var.region
  ami_regions   = var.ami_regions
  instance_type = var.instance_type
  subnet_id     = var.subnet_id
  ssh_username  = var.ssh_username
  ami_name      = "${var.deployment}-agent-${local.stamp}"

  source_ami_filter {
    filters = {
      name                = var.source_ami_name
      virtualization-type = "hvm"
      architecture        = "x86_64"
    }
    owners      = [var.source_ami_owner]
    most_recent = true
  }

  launch_block_device_mappings {
    device_name           = "/dev/sda1"
    volume_size           = 100
    volume_type           = "gp3"
    iops                  = 3000
    throughput            = 250
    encrypted             = true
    delete_on_termination = true
  }

  tags = {
    "autoscaler:image"      = "agent"
    "autoscaler:deployment" = var.deployment
  }
}

build {
  sources = ["source.amazon-ebs.agent"]

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
