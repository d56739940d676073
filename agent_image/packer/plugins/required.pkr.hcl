# Plugins for Packer >= 1.7, where builders are separate plugins:
#   packer init agent_image/packer/plugins/required.pkr.hcl
# Kept out of the templates' own files because Packer 1.6 (Debian's, which the
# offline tests use) does not know the required_plugins block.
packer {
  required_version = ">= 1.7.0"
  required_plugins {
    amazon = {
      source  = "github.com/hashicorp/amazon"
      version = ">= 1.3.0"
    }
    googlecompute = {
      source  = "github.com/hashicorp/googlecompute"
      version = ">= 1.1.0"
    }
    azure = {
      source  = "github.com/hashicorp/azure"
      version = ">= 2.0.0"
    }
  }
}
