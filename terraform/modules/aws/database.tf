# RDS PostgreSQL: the queue, the fleet records, the ledger. The master password is
# generated and rotated by RDS in Secrets Manager (manage_master_user_password), so no
# password passes through Terraform state or user-data.

resource "aws_db_subnet_group" "this" {
  name       = "${local.name}-autoscaler"
  subnet_ids = var.subnet_ids
  tags       = local.tags
}

resource "aws_db_parameter_group" "this" {
  name   = "${local.name}-autoscaler"
  family = "postgres${split(".", var.db_engine_version)[0]}"

  # Refuse unencrypted connections: the control plane connects with sslmode=require.
  parameter {
    name  = "rds.force_ssl"
    value = "1"
  }
  # Schema changes are logged (migrations run on every start), and slow queries too.
  parameter {
    name  = "log_statement"
    value = "ddl"
  }
  parameter {
    name  = "log_min_duration_statement"
    value = "1000"
  }
  tags = local.tags
}

resource "aws_db_instance" "this" {
  #checkov:skip=CKV_AWS_161:the control plane authenticates with the RDS-managed password from Secrets Manager; IAM auth tokens expire every 15 min and psycopg's pool would need a token hook
  #checkov:skip=CKV_AWS_118:enhanced monitoring needs an extra IAM role and costs per instance; CloudWatch logs and Performance Insights are on
  identifier                    = "${local.name}-autoscaler"
  engine                        = "postgres"
  engine_version                = var.db_engine_version
  instance_class                = var.db_instance_class
  allocated_storage             = var.db_allocated_storage_gb
  max_allocated_storage         = var.db_allocated_storage_gb * 5
  storage_type                  = "gp3"
  storage_encrypted             = true
  kms_key_id                    = aws_kms_key.this.arn
  db_name                       = "autoscaler"
  username                      = "autoscaler"
  manage_master_user_password   = true
  master_user_secret_kms_key_id = aws_kms_key.this.arn

  db_subnet_group_name   = aws_db_subnet_group.this.name
  parameter_group_name   = aws_db_parameter_group.this.name
  vpc_security_group_ids = [aws_security_group.db.id]
  publicly_accessible    = false
  multi_az               = var.db_multi_az

  backup_retention_period         = 7
  copy_tags_to_snapshot           = true
  deletion_protection             = var.deletion_protection
  skip_final_snapshot             = !var.deletion_protection
  final_snapshot_identifier       = var.deletion_protection ? "${local.name}-autoscaler-final" : null
  auto_minor_version_upgrade      = true
  enabled_cloudwatch_logs_exports = ["postgresql", "upgrade"]

  performance_insights_enabled    = true
  performance_insights_kms_key_id = aws_kms_key.this.arn

  tags = local.tags
}
