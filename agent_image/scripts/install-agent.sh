#!/usr/bin/env bash
# Install the autoscaler agent into its own virtualenv and enable its systemd unit.
# Runs at image build time. Packer has uploaded the unit, the exit script and (when
# building from a checkout) the wheel into $STAGING.
#
# Environment:
#   STAGING        upload directory (default /tmp/autoscaler-agent)
#   AGENT_VERSION  install gpu-autoscaler==VERSION from the configured package index,
#                  used when no wheel was uploaded
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
STAGING="${STAGING:-/tmp/autoscaler-agent}"
PREFIX=/opt/autoscaler-agent

log() { echo "install-agent: $*" >&2; }

# Ubuntu 24.04 (the templates' default base) ships Python 3.12; the venv module is a
# separate package there.
if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
  apt-get update -q
  apt-get install -y --no-install-recommends python3-venv
fi
if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  log "the agent needs Python >= 3.11; this base image has $(python3 --version 2>&1)"
  exit 1
fi

wheel="$(find "$STAGING" -maxdepth 1 -name 'gpu_autoscaler-*.whl' | sort | tail -n1)"
if [ -n "$wheel" ]; then
  spec="${wheel}[gpu]"
elif [ -n "${AGENT_VERSION:-}" ]; then
  spec="gpu-autoscaler[gpu]==${AGENT_VERSION}"
else
  log "no wheel in $STAGING and no AGENT_VERSION: set the Packer variable agent_wheel or agent_version"
  exit 1
fi

python3 -m venv "$PREFIX"
"$PREFIX/bin/pip" install --no-cache-dir --upgrade pip
"$PREFIX/bin/pip" install --no-cache-dir "$spec"
"$PREFIX/bin/autoscaler" --help >/dev/null   # fail the build now, not on the first boot
ln -sf "$PREFIX/bin/autoscaler" /usr/local/bin/autoscaler

install -d -m 0755 /usr/local/libexec/autoscaler
install -m 0755 "$STAGING/autoscaler-agent-exit" /usr/local/libexec/autoscaler/autoscaler-agent-exit
install -m 0644 "$STAGING/autoscaler-agent.service" /etc/systemd/system/autoscaler-agent.service
# The bootstrap file holds a join token: only root may read the directory.
install -d -m 0700 /etc/autoscaler
systemctl daemon-reload
systemctl enable autoscaler-agent.service
log "installed $("$PREFIX/bin/pip" show gpu-autoscaler | awk '/^Version:/ {print $2}')"

# An image must not carry one build's identity into every VM started from it.
rm -rf "$STAGING"
cloud-init clean --logs --seed 2>/dev/null || true
