# HTTPS ends here; the control plane listens on 8080 inside the VPC and is started with
# --tls-terminated-upstream (the config module sets tls_terminated_upstream).

resource "aws_lb" "api" {
  #checkov:skip=CKV_AWS_91:access logs need an S3 bucket with its own policy per region; the API logs every request itself
  #checkov:skip=CKV2_AWS_28:a WAF is an account-level choice; attach one with aws_wafv2_web_acl_association if the API is public
  name                       = "${substr(local.name, 0, 24)}-api"
  internal                   = var.lb_internal
  load_balancer_type         = "application"
  security_groups            = [aws_security_group.lb.id]
  subnets                    = local.lb_subnet_ids
  drop_invalid_header_fields = true
  enable_deletion_protection = var.deletion_protection
  tags                       = local.tags
}

resource "aws_lb_target_group" "api" {
  #checkov:skip=CKV_AWS_378:TLS ends at the load balancer; the hop to the control plane stays inside the VPC, between two security groups that admit only each other
  name     = "${substr(local.name, 0, 24)}-api"
  port     = 8080
  protocol = "HTTP"
  vpc_id   = var.vpc_id
  health_check {
    path                = "/healthz"
    matcher             = "200"
    interval            = 15
    healthy_threshold   = 2
    unhealthy_threshold = 3
  }
  tags = local.tags
}

resource "aws_lb_target_group_attachment" "control_plane" {
  target_group_arn = aws_lb_target_group.api.arn
  target_id        = aws_instance.control_plane.id
  port             = 8080
}

resource "aws_lb_listener" "https" {
  load_balancer_arn = aws_lb.api.arn
  port              = 443
  protocol          = "HTTPS"
  ssl_policy        = "ELBSecurityPolicy-TLS13-1-2-2021-06"
  certificate_arn   = var.certificate_arn
  default_action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.api.arn
  }
  tags = local.tags
}
