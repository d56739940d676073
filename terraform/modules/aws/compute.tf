# The control plane host: Amazon Linux 2023 running the control plane container under
# systemd. user_data carries configuration and policy files but no secret: the host
# reads the database password from Secrets Manager and keeps the admin token in SSM.

locals {
  control_plane_cloud_init = templatefile("${path.module}/templates/control-plane.cloud-init.yaml.tftpl", {
    config_yaml      = module.config.yaml
    policy_dir       = "/etc/autoscaler/policies"
    policy_files     = var.policy_files
    image            = var.control_plane_image
    region           = local.region
    db_host          = aws_db_instance.this.address
    db_port          = aws_db_instance.this.port
    db_name          = aws_db_instance.this.db_name
    db_secret_arn    = aws_db_instance.this.master_user_secret[0].secret_arn
    admin_token_name = aws_ssm_parameter.admin_token.name
    kms_key_arn      = aws_kms_key.this.arn
  })
  # EC2 user data is limited to 16 KiB; the shipped policies alone come close, so the
  # document is gzipped (cloud-init unpacks it).
  control_plane_user_data = base64gzip(local.control_plane_cloud_init)
}

resource "aws_instance" "control_plane" {
  ami                    = coalesce(var.control_plane_ami_id, try(nonsensitive(data.aws_ssm_parameter.al2023[0].value), null))
  instance_type          = var.control_plane_instance_type
  subnet_id              = var.subnet_ids[0]
  vpc_security_group_ids = [aws_security_group.control_plane.id]
  iam_instance_profile   = aws_iam_instance_profile.control_plane.name
  monitoring             = true
  ebs_optimized          = true

  user_data_base64 = local.control_plane_user_data
  # Configuration lives in user_data and state lives in RDS: a change replaces the host,
  # and the new one runs the migrations on start.
  user_data_replace_on_change = true

  metadata_options {
    http_endpoint = "enabled"
    http_tokens   = "required" # IMDSv2 only
    # 2 hops: the container reaches the instance role through the docker bridge.
    http_put_response_hop_limit = 2
  }

  root_block_device {
    volume_type = "gp3"
    volume_size = 30
    encrypted   = true
    kms_key_id  = aws_kms_key.this.arn
  }

  lifecycle {
    precondition {
      condition     = length(local.control_plane_user_data) * 3 / 4 <= 16384
      error_message = "The control plane's user data (configuration + policy files, gzipped) exceeds EC2's 16 KiB: ship fewer or smaller policy files."
    }
  }

  tags = merge(local.tags, { Name = "${local.name}-control-plane" })
}
