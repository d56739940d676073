# The control plane on GCP: a Container-Optimized OS VM running the control plane
# container, Cloud SQL PostgreSQL on a private IP, the database password and admin token
# in Secret Manager, and two service accounts: the control plane's (create/delete only
# VMs named for this deployment) and the agents' (no role: an agent's one-time join
# token comes in its instance metadata, docs/deploy.md). There is no GCP provider
# mirror here: the module is checked by fmt, checkov and structure tests
# (tests/deploy/test_terraform_structure.py).

locals {
  name        = var.deployment
  agent_names = "projects/${var.project_id}/zones/${var.zone}/instances/${local.name}-"
  labels      = merge(var.labels, { autoscaler-deployment = local.name })
}

module "config" {
  source = "../config"

  deployment   = var.deployment
  public_url   = var.public_url
  teams        = var.teams
  queues       = var.queues
  pools        = var.pools
  policy_files = var.policy_files

  # Only keys providers/gcp/settings.py knows (it refuses others).
  pool_options_provider = "gcp"
  pool_options = {
    project         = var.project_id
    network         = var.network
    subnetwork      = var.subnetwork
    service_account = google_service_account.agent.email
    name_prefix     = local.name
    external_ip     = false
  }
}

resource "google_service_account" "control_plane" {
  project      = var.project_id
  account_id   = "${local.name}-cp"
  display_name = "GPU autoscaler control plane (${local.name})"
}

resource "google_service_account" "agent" {
  project      = var.project_id
  account_id   = "${local.name}-agent"
  display_name = "GPU autoscaler agent (${local.name})"
}

# Compute rights without compute.instances.* on the whole project: an IAM condition
# limits create/delete to instances whose name starts with "<deployment>-", the
# prefix providers/gcp gives every VM it launches (name_prefix above).
resource "google_project_iam_custom_role" "launcher" {
  project     = var.project_id
  role_id     = replace("${local.name}_autoscaler_launcher", "-", "_")
  title       = "GPU autoscaler launcher (${local.name})"
  description = "Create and delete this deployment's agent VMs."
  permissions = [
    "compute.instances.create",
    "compute.instances.delete",
    "compute.instances.get",
    "compute.instances.setLabels",
    "compute.instances.setMetadata",
    "compute.instances.setServiceAccount",
    "compute.disks.create",
    "compute.subnetworks.use",
    "compute.images.useReadOnly",
    "compute.zoneOperations.get",
  ]
}

resource "google_project_iam_custom_role" "observer" {
  project     = var.project_id
  role_id     = replace("${local.name}_autoscaler_observer", "-", "_")
  title       = "GPU autoscaler observer (${local.name})"
  description = "List VMs, machine and accelerator types (read-only)."
  permissions = [
    "compute.instances.list",
    "compute.machineTypes.get",
    "compute.machineTypes.list",
    "compute.acceleratorTypes.list",
    "compute.zones.list",
  ]
}

resource "google_project_iam_member" "launcher" {
  project = var.project_id
  role    = google_project_iam_custom_role.launcher.id
  member  = "serviceAccount:${google_service_account.control_plane.email}"
  condition {
    title      = "only-${local.name}-agents"
    expression = "resource.name.startsWith(\"${local.agent_names}\") || resource.type != \"compute.googleapis.com/Instance\""
  }
}

resource "google_project_iam_member" "observer" {
  project = var.project_id
  role    = google_project_iam_custom_role.observer.id
  member  = "serviceAccount:${google_service_account.control_plane.email}"
}

# The control plane launches VMs that run as the agent account, and nothing else.
resource "google_service_account_iam_member" "control_plane_uses_agent" {
  service_account_id = google_service_account.agent.name
  role               = "roles/iam.serviceAccountUser"
  member             = "serviceAccount:${google_service_account.control_plane.email}"
}
