# The control plane host: Container-Optimized OS running the Cloud SQL Auth Proxy and
# the control plane container. Put an HTTPS load balancer (or IAP) in front and set
# public_url to it: the API listens on 8080 without TLS (--tls-terminated-upstream).
resource "google_compute_instance" "control_plane" {
  #checkov:skip=CKV_GCP_38:customer-supplied keys must accompany every start call, so the host could not restart itself; the disk holds no state (Google-managed encryption)
  project      = var.project_id
  name         = "${local.name}-control-plane"
  zone         = var.zone
  machine_type = var.control_plane_machine_type
  labels       = local.labels
  tags         = ["${local.name}-control-plane"]

  boot_disk {
    initialize_params {
      image = "cos-cloud/cos-stable"
    }
  }

  network_interface {
    subnetwork = var.subnetwork
    # No external IP: reach it through the load balancer.
  }

  service_account {
    email  = google_service_account.control_plane.email
    scopes = ["cloud-platform"]
  }

  shielded_instance_config {
    enable_secure_boot          = true
    enable_vtpm                 = true
    enable_integrity_monitoring = true
  }

  metadata = {
    block-project-ssh-keys = "true"
    enable-oslogin         = "TRUE"
    user-data = templatefile("${path.module}/templates/control-plane.cloud-init.yaml.tftpl", {
      config_yaml     = module.config.yaml
      policy_files    = var.policy_files
      image           = var.control_plane_image
      sql_connection  = google_sql_database_instance.this.connection_name
      db_user         = google_sql_user.control_plane.name
      admin_token_id  = google_secret_manager_secret.admin_token.secret_id
      project_id      = var.project_id
      sql_proxy_image = var.sql_proxy_image
      gcloud_image    = var.gcloud_image
    })
  }
}
