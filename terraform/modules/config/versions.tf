terraform {
  # optional() object attributes with defaults.
  required_version = ">= 1.3"
}
