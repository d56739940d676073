resource "google_sql_database_instance" "this" {
  #checkov:skip=CKV_GCP_6:ssl_mode = ENCRYPTED_ONLY refuses unencrypted connections (the check looks for the deprecated require_ssl)
  #checkov:skip=CKV_GCP_79:PostgreSQL 16 on every cloud so one migration set is tested against one major version
  #checkov:skip=CKV2_GCP_20:point-in-time recovery is on; a cross-region replica is left to the operator's DR plan
  project             = var.project_id
  name                = "${local.name}-autoscaler"
  region              = var.region
  database_version    = "POSTGRES_16"
  deletion_protection = var.deletion_protection

  settings {
    tier              = var.db_tier
    availability_type = "REGIONAL"
    user_labels       = local.labels

    ip_configuration {
      ipv4_enabled    = false # private IP only
      private_network = var.network
      ssl_mode        = "ENCRYPTED_ONLY"
    }
    backup_configuration {
      enabled                        = true
      point_in_time_recovery_enabled = true
    }
    database_flags {
      name  = "log_checkpoints"
      value = "on"
    }
    database_flags {
      name  = "log_connections"
      value = "on"
    }
    database_flags {
      name  = "log_disconnections"
      value = "on"
    }
    database_flags {
      name  = "log_lock_waits"
      value = "on"
    }
    database_flags {
      name  = "log_min_duration_statement"
      value = "-1"
    }
    database_flags {
      name  = "log_min_messages"
      value = "error"
    }
    database_flags {
      name  = "log_temp_files"
      value = "0"
    }
    database_flags {
      name  = "log_duration"
      value = "on"
    }
    database_flags {
      name  = "log_hostname"
      value = "on"
    }
    database_flags {
      name  = "log_min_error_statement"
      value = "error"
    }
    database_flags {
      name  = "log_statement"
      value = "ddl"
    }
    database_flags {
      name  = "cloudsql.iam_authentication"
      value = "on"
    }
    database_flags {
      name  = "cloudsql.enable_pgaudit"
      value = "on"
    }
  }
}

resource "google_sql_database" "autoscaler" {
  project  = var.project_id
  name     = "autoscaler"
  instance = google_sql_database_instance.this.name
}

# No password at all: the control plane's service account logs in with IAM database
# authentication through the Cloud SQL Auth Proxy running beside it.
resource "google_sql_user" "control_plane" {
  project  = var.project_id
  instance = google_sql_database_instance.this.name
  name     = trimsuffix(google_service_account.control_plane.email, ".gserviceaccount.com")
  type     = "CLOUD_IAM_SERVICE_ACCOUNT"
}

resource "google_project_iam_member" "control_plane_sql" {
  for_each = toset(["roles/cloudsql.client", "roles/cloudsql.instanceUser"])
  project  = var.project_id
  role     = each.value
  member   = "serviceAccount:${google_service_account.control_plane.email}"
}

resource "google_secret_manager_secret" "admin_token" {
  project   = var.project_id
  secret_id = "${local.name}-admin-token"
  labels    = local.labels
  replication {
    auto {}
  }
}

resource "google_secret_manager_secret_iam_member" "control_plane_secrets" {
  for_each  = { admin = google_secret_manager_secret.admin_token.id }
  project   = var.project_id
  secret_id = each.value
  role      = "roles/secretmanager.secretVersionManager"
  member    = "serviceAccount:${google_service_account.control_plane.email}"
}

resource "google_secret_manager_secret_iam_member" "control_plane_secrets_read" {
  for_each  = { admin = google_secret_manager_secret.admin_token.id }
  project   = var.project_id
  secret_id = each.value
  role      = "roles/secretmanager.secretAccessor"
  member    = "serviceAccount:${google_service_account.control_plane.email}"
}
