# Security groups: the load balancer is the only way in; the control plane accepts only
# the load balancer; the database accepts only the control plane; agents accept nothing.

resource "aws_security_group" "lb" {
  name        = "${local.name}-api-lb"
  description = "API load balancer of ${local.name}"
  vpc_id      = var.vpc_id
  tags        = local.tags
}

resource "aws_vpc_security_group_ingress_rule" "lb_from_cidrs" {
  for_each          = toset(var.api_allowed_cidrs)
  security_group_id = aws_security_group.lb.id
  description       = "API over HTTPS from an allowed network"
  cidr_ipv4         = each.value
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
}

resource "aws_vpc_security_group_ingress_rule" "lb_from_agents" {
  security_group_id            = aws_security_group.lb.id
  description                  = "API over HTTPS from this deployment's agents"
  referenced_security_group_id = aws_security_group.agent.id
  ip_protocol                  = "tcp"
  from_port                    = 443
  to_port                      = 443
}

resource "aws_vpc_security_group_egress_rule" "lb_to_control_plane" {
  security_group_id            = aws_security_group.lb.id
  description                  = "Forward to the control plane"
  referenced_security_group_id = aws_security_group.control_plane.id
  ip_protocol                  = "tcp"
  from_port                    = 8080
  to_port                      = 8080
}

resource "aws_security_group" "control_plane" {
  name        = "${local.name}-control-plane"
  description = "Control plane host of ${local.name}"
  vpc_id      = var.vpc_id
  tags        = local.tags
}

resource "aws_vpc_security_group_ingress_rule" "control_plane_from_lb" {
  security_group_id            = aws_security_group.control_plane.id
  description                  = "API from the load balancer"
  referenced_security_group_id = aws_security_group.lb.id
  ip_protocol                  = "tcp"
  from_port                    = 8080
  to_port                      = 8080
}

resource "aws_vpc_security_group_egress_rule" "control_plane_https" {
  #checkov:skip=CKV_AWS_382:the control plane calls AWS APIs (EC2, SSM, Secrets Manager) and pulls its image over HTTPS; port-limited to 443, endpoints vary by region
  security_group_id = aws_security_group.control_plane.id
  description       = "AWS APIs and the container registry over HTTPS"
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
}

resource "aws_vpc_security_group_egress_rule" "control_plane_db" {
  security_group_id            = aws_security_group.control_plane.id
  description                  = "PostgreSQL"
  referenced_security_group_id = aws_security_group.db.id
  ip_protocol                  = "tcp"
  from_port                    = 5432
  to_port                      = 5432
}

resource "aws_security_group" "db" {
  name        = "${local.name}-db"
  description = "PostgreSQL of ${local.name}"
  vpc_id      = var.vpc_id
  tags        = local.tags
}

resource "aws_vpc_security_group_ingress_rule" "db_from_control_plane" {
  security_group_id            = aws_security_group.db.id
  description                  = "PostgreSQL from the control plane"
  referenced_security_group_id = aws_security_group.control_plane.id
  ip_protocol                  = "tcp"
  from_port                    = 5432
  to_port                      = 5432
}

resource "aws_security_group" "agent" {
  #checkov:skip=CKV2_AWS_5:attached to agent instances at launch by the control plane (pool option security_group_ids), not by Terraform
  name        = "${local.name}-agent"
  description = "GPU agents of ${local.name}: no inbound traffic, the agent only calls out"
  vpc_id      = var.vpc_id
  tags        = local.tags
}

resource "aws_vpc_security_group_egress_rule" "agent_out" {
  #checkov:skip=CKV_AWS_382:tasks fetch data sets, code and containers from wherever their owners keep them; agents accept no inbound traffic
  security_group_id = aws_security_group.agent.id
  description       = "Tasks and the agent call out (API, data, registries)"
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "-1"
}
