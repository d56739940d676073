terraform {
  required_version = ">= 1.7" # mock_provider in the module's tests
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.40, < 7.0"
    }
  }
}
