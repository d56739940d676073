#!/usr/bin/env bash
# Make sure `packer` is on PATH for the agent image tests (tests/deploy).
# Debian's package (1.6.6) validates HCL2 amazon-ebs, googlecompute and azure-arm
# templates offline, which is all the tests need. Idempotent: installs only if missing.
set -euo pipefail

if command -v packer >/dev/null 2>&1; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure-packer: packer is missing and apt-get is not available; install packer (>= 1.6) by hand" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "ensure-packer: installing Debian's packer" >&2
export DEBIAN_FRONTEND=noninteractive
if ! apt-cache show packer >/dev/null 2>&1; then
  $SUDO apt-get update -qq
fi
if ! $SUDO apt-get install -y --no-install-recommends packer >/dev/null; then
  # The package list may be stale; refresh once and retry.
  $SUDO apt-get update -qq
  $SUDO apt-get install -y --no-install-recommends packer >/dev/null
fi
command -v packer >/dev/null
