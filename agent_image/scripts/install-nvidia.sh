#!/usr/bin/env bash
# Make the image GPU-ready: NVIDIA driver and, where asked, the NVIDIA container toolkit.
# Runs at image build time (Packer), never at boot, so a new VM does not spend minutes
# compiling kernel modules. Skips whatever the base image already has, so the same
# script serves GPU-ready bases (AWS Deep Learning AMIs) and plain Ubuntu.
#
# Environment:
#   INSTALL_CONTAINER_TOOLKIT  "true" to require nvidia-container-toolkit (container tasks)
#   CONTAINER_TOOLKIT_APT_SOURCE  optional apt "deb ..." line for NVIDIA's repository,
#                              used when the configured sources do not carry the toolkit
#   CONTAINER_TOOLKIT_KEY_URL  the signing key for that repository
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

log() { echo "install-nvidia: $*" >&2; }

if command -v nvidia-smi >/dev/null 2>&1; then
  log "driver already present in the base image: $(nvidia-smi --version 2>/dev/null | head -n1 || echo unknown)"
else
  if ! command -v apt-get >/dev/null 2>&1; then
    log "no driver and no apt-get: use a GPU-ready base image for this distribution"; exit 1
  fi
  apt-get update -q
  apt-get install -y --no-install-recommends ubuntu-drivers-common
  # --gpgpu picks the headless server driver recommended for the attached GPU; the
  # build VM therefore must be a GPU instance type (the templates default to one).
  ubuntu-drivers install --gpgpu
  driver_pkg="$(dpkg-query -W -f='${Package}\n' 'nvidia-driver-*-server' 2>/dev/null | head -n1 || true)"
  if [ -n "$driver_pkg" ]; then
    apt-get install -y --no-install-recommends "nvidia-utils-${driver_pkg#nvidia-driver-}"
  fi
fi

if [ "${INSTALL_CONTAINER_TOOLKIT:-false}" = "true" ]; then
  if command -v nvidia-ctk >/dev/null 2>&1; then
    log "container toolkit already present"
  else
    if ! apt-cache show nvidia-container-toolkit >/dev/null 2>&1; then
      if [ -z "${CONTAINER_TOOLKIT_APT_SOURCE:-}" ]; then
        log "nvidia-container-toolkit is not in the configured apt sources; set the Packer variables" \
            "container_toolkit_apt_source and container_toolkit_key_url (NVIDIA's install guide lists them)"
        exit 1
      fi
      curl -fsSL "${CONTAINER_TOOLKIT_KEY_URL:?CONTAINER_TOOLKIT_KEY_URL is required with an apt source}" \
        | gpg --dearmor -o /usr/share/keyrings/nvidia-container-toolkit.gpg
      echo "$CONTAINER_TOOLKIT_APT_SOURCE" > /etc/apt/sources.list.d/nvidia-container-toolkit.list
      apt-get update -q
    fi
    apt-get install -y --no-install-recommends nvidia-container-toolkit
    if command -v docker >/dev/null 2>&1; then
      nvidia-ctk runtime configure --runtime=docker
    fi
  fi
  # The engine the agent runs container tasks with (docker is used if the base has it),
  # with catatonit: the agent runs `podman run --init`, and podman only recommends it.
  if ! command -v podman >/dev/null 2>&1 && ! command -v docker >/dev/null 2>&1; then
    apt-get install -y --no-install-recommends podman catatonit
  fi
fi
