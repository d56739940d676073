# Two roles, each with only what its holder needs. docs/deploy.md lists every
# permission with the reason for it; keep the two in step.

locals {
  ec2_arn      = "${local.arn_prefix}:ec2:${local.region}:${local.account_id}"
  owner_filter = { "aws:RequestTag/${local.owner_tag_key}" = local.name }

  # Resources RunInstances/CreateFleet create: allowed only when the request tags them
  # with this deployment as owner, so the role cannot start untagged (invisible) VMs.
  launched_resources = [
    "${local.ec2_arn}:instance/*",
    "${local.ec2_arn}:volume/*",
    "${local.ec2_arn}:network-interface/*",
    "${local.ec2_arn}:spot-instances-request/*",
    "${local.ec2_arn}:fleet/*",
  ]
  launch_templates = "${local.ec2_arn}:launch-template/*"
  placement_groups = "${local.ec2_arn}:placement-group/*"

  control_plane_policy = {
    Version = "2012-10-17"
    Statement = [
      {
        Sid       = "LaunchOnlyOwnerTagged"
        Effect    = "Allow"
        Action    = ["ec2:RunInstances", "ec2:CreateFleet"]
        Resource  = local.launched_resources
        Condition = { StringEquals = local.owner_filter }
      },
      {
        # Existing resources a launch references: any image (pools choose their AMI),
        # but only the agent subnets and the agent security group.
        Sid    = "LaunchIntoAgentNetwork"
        Effect = "Allow"
        Action = ["ec2:RunInstances", "ec2:CreateFleet"]
        Resource = concat(
          ["${local.arn_prefix}:ec2:${local.region}::image/*", "${local.ec2_arn}:launch-template/*"],
          # A gang launches into a cluster placement group (pool option placement_group).
          [local.placement_groups],
          [for s in local.agent_subnet_ids : "${local.ec2_arn}:subnet/${s}"],
          [aws_security_group.agent.arn],
        )
      },
      {
        # Tags only as part of a launch: the role can neither adopt foreign instances
        # by tagging them nor strip the owner tag from its own.
        Sid       = "TagOnlyAtLaunch"
        Effect    = "Allow"
        Action    = "ec2:CreateTags"
        Resource  = concat(local.launched_resources, [local.launch_templates, local.placement_groups])
        Condition = { StringEquals = { "ec2:CreateAction" = ["RunInstances", "CreateFleet", "CreateLaunchTemplate", "CreatePlacementGroup"] } }
      },
      {
        Sid       = "TerminateOnlyOwnerTagged"
        Effect    = "Allow"
        Action    = ["ec2:TerminateInstances", "ec2:StopInstances"]
        Resource  = "${local.ec2_arn}:instance/*"
        Condition = { StringEquals = { "ec2:ResourceTag/${local.owner_tag_key}" = local.name } }
      },
      {
        # EC2 Describe* calls support no resource-level permissions; they are read-only.
        Sid    = "ObserveFleetAndPrices"
        Effect = "Allow"
        Action = [
          "ec2:DescribeInstances",
          "ec2:DescribeInstanceStatus",
          "ec2:DescribeInstanceTypes",
          "ec2:DescribeInstanceTypeOfferings",
          "ec2:DescribeSpotPriceHistory",
          "ec2:DescribeImages",
          "ec2:DescribeSubnets",
          "ec2:DescribeAvailabilityZones",
          "ec2:DescribePlacementGroups",
        ]
        Resource = "*"
      },
      {
        Sid       = "PassOnlyAgentRole"
        Effect    = "Allow"
        Action    = "iam:PassRole"
        Resource  = aws_iam_role.agent.arn
        Condition = { StringEquals = { "iam:PassedToService" = "ec2.amazonaws.com" } }
      },
      {
        # The first spot launch in an account creates EC2's spot service-linked role.
        Sid       = "SpotServiceLinkedRole"
        Effect    = "Allow"
        Action    = "iam:CreateServiceLinkedRole"
        Resource  = "${local.arn_prefix}:iam::${local.account_id}:role/aws-service-role/spot.amazonaws.com/AWSServiceRoleForEC2Spot"
        Condition = { StringEquals = { "iam:AWSServiceName" = "spot.amazonaws.com" } }
      },
      {
        # launch_api "fleet" (the driver's default) writes a one-shot launch template per
        # request (CreateFleet takes no inline instance data) and deletes it right after.
        Sid       = "LaunchTemplatesOnlyOwnerTagged"
        Effect    = "Allow"
        Action    = "ec2:CreateLaunchTemplate"
        Resource  = local.launch_templates
        Condition = { StringEquals = local.owner_filter }
      },
      {
        Sid       = "DeleteOwnLaunchTemplates"
        Effect    = "Allow"
        Action    = "ec2:DeleteLaunchTemplate"
        Resource  = local.launch_templates
        Condition = { StringEquals = { "ec2:ResourceTag/${local.owner_tag_key}" = local.name } }
      },
      {
        # placement_group {strategy: cluster}: one cluster placement group per gang,
        # created tagged with this deployment and deleted once the gang is gone.
        Sid       = "PlacementGroupsOnlyOwnerTagged"
        Effect    = "Allow"
        Action    = "ec2:CreatePlacementGroup"
        Resource  = local.placement_groups
        Condition = { StringEquals = local.owner_filter }
      },
      {
        Sid       = "DeleteOwnPlacementGroups"
        Effect    = "Allow"
        Action    = "ec2:DeletePlacementGroup"
        Resource  = local.placement_groups
        Condition = { StringEquals = { "ec2:ResourceTag/${local.owner_tag_key}" = local.name } }
      },
      {
        Sid      = "KeepAdminToken"
        Effect   = "Allow"
        Action   = ["ssm:GetParameter", "ssm:PutParameter"]
        Resource = aws_ssm_parameter.admin_token.arn
      },
      {
        Sid      = "ReadDatabasePassword"
        Effect   = "Allow"
        Action   = "secretsmanager:GetSecretValue"
        Resource = aws_db_instance.this.master_user_secret[0].secret_arn
      },
      {
        Sid      = "UseKeyThroughSsmAndSecrets"
        Effect   = "Allow"
        Action   = ["kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey"]
        Resource = aws_kms_key.this.arn
        Condition = { StringEquals = { "kms:ViaService" = [
          "ssm.${local.region}.amazonaws.com",
          "secretsmanager.${local.region}.amazonaws.com",
        ] } }
      },
      {
        # Agent disks encrypted with this key: EC2 needs a grant made on the caller's behalf.
        Sid      = "EncryptAgentVolumes"
        Effect   = "Allow"
        Action   = ["kms:CreateGrant", "kms:GenerateDataKeyWithoutPlaintext", "kms:Decrypt", "kms:DescribeKey"]
        Resource = aws_kms_key.this.arn
        Condition = {
          StringEquals = { "kms:ViaService" = "ec2.${local.region}.amazonaws.com" }
          Bool         = { "kms:GrantIsForAWSResource" = "true" }
        }
      },
    ]
  }

  ec2_trust = {
    Version = "2012-10-17"
    Statement = [{
      Effect    = "Allow"
      Principal = { Service = "ec2.amazonaws.com" }
      Action    = "sts:AssumeRole"
    }]
  }
}

resource "aws_iam_role" "control_plane" {
  name               = "${local.name}-control-plane"
  assume_role_policy = jsonencode(local.ec2_trust)
  tags               = local.tags
}

resource "aws_iam_role_policy" "control_plane" {
  name   = "autoscaler-control-plane"
  role   = aws_iam_role.control_plane.id
  policy = jsonencode(local.control_plane_policy)
}

resource "aws_iam_instance_profile" "control_plane" {
  name = "${local.name}-control-plane"
  role = aws_iam_role.control_plane.name
  tags = local.tags
}

# No policy: an agent needs nothing from AWS to join (its one-time join token comes in
# user-data). Operators attach what their tasks need (ECR pulls, S3 data) to this role.
resource "aws_iam_role" "agent" {
  name               = "${local.name}-agent"
  assume_role_policy = jsonencode(local.ec2_trust)
  tags               = local.tags
}

resource "aws_iam_instance_profile" "agent" {
  name = "${local.name}-agent"
  role = aws_iam_role.agent.name
  tags = local.tags
}
