#!/usr/bin/env bash
# Install the autoscaler agent into its own virtualenv and enable its systemd unit,
# create the unprivileged user tasks run as, and install the guard that keeps tasks
# away from the instance metadata service. Runs at image build time. Packer has
# uploaded the units, the exit and guard scripts and (when building from a
# checkout) the wheel into $STAGING. tests/deploy/test_install_agent.py runs it in a
# Debian container.
#
# Environment:
#   STAGING        upload directory (default /tmp/autoscaler-agent)
#   AGENT_VERSION  install gpu-autoscaler==VERSION from the configured package index,
#                  used when no wheel was uploaded
#   TASK_USER      the user tasks run as (default autoscaler-task; the agent's run_as)
#   TASK_GROUPS    extra groups for it where they exist (default video,render: GPU
#                  device nodes on some images belong to them)
# A directory $STAGING/wheels makes pip install offline from it (--no-index).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
STAGING="${STAGING:-/tmp/autoscaler-agent}"
PREFIX=/opt/autoscaler-agent
TASK_USER="${TASK_USER:-autoscaler-task}"
TASK_GROUPS="${TASK_GROUPS:-video,render}"

log() { echo "install-agent: $*" >&2; }

# Ubuntu 24.04 (the templates' default base) ships Python 3.12; the venv module is a
# separate package there.
if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
  apt-get update -q
  apt-get install -y --no-install-recommends python3-venv
fi
# The metadata guard (autoscaler-imds-guard) needs iptables.
if ! command -v iptables >/dev/null 2>&1; then
  apt-get update -q
  apt-get install -y --no-install-recommends iptables
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
if [ -d "$STAGING/wheels" ]; then
  "$PREFIX/bin/pip" install --no-cache-dir --no-index --find-links "$STAGING/wheels" "$spec"
else
  "$PREFIX/bin/pip" install --no-cache-dir --upgrade pip
  "$PREFIX/bin/pip" install --no-cache-dir "$spec"
fi
"$PREFIX/bin/autoscaler" --help >/dev/null   # fail the build now, not on the first boot
ln -sf "$PREFIX/bin/autoscaler" /usr/local/bin/autoscaler

install -d -m 0755 /usr/local/libexec/autoscaler
install -m 0755 "$STAGING/autoscaler-agent-exit" /usr/local/libexec/autoscaler/autoscaler-agent-exit
install -m 0755 "$STAGING/autoscaler-imds-guard" /usr/local/libexec/autoscaler/autoscaler-imds-guard
install -m 0644 "$STAGING/autoscaler-agent.service" /etc/systemd/system/autoscaler-agent.service
install -m 0644 "$STAGING/autoscaler-imds-guard.service" /etc/systemd/system/autoscaler-imds-guard.service
# The bootstrap file holds a join token until the agent has joined (it then removes
# it): only root may read the directory.
install -d -m 0700 /etc/autoscaler

# Tasks run as this user, never as root (the agent refuses root tasks unless its
# allow_root_tasks is set). A system user: no password, no login shell, no home.
if ! id -u "$TASK_USER" >/dev/null 2>&1; then
  useradd --system --user-group --no-create-home --home-dir /nonexistent \
    --shell /usr/sbin/nologin --comment "GPU autoscaler tasks" "$TASK_USER"
fi
for g in $(echo "$TASK_GROUPS" | tr ',' ' '); do
  if getent group "$g" >/dev/null; then usermod -a -G "$g" "$TASK_USER"; fi
done
log "tasks run as $TASK_USER (uid $(id -u "$TASK_USER"))"

# daemon-reload needs a running systemd (an image build VM has one; a container
# build does not); enable only writes symlinks and works either way.
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload
fi
systemctl enable autoscaler-imds-guard.service
systemctl enable autoscaler-agent.service
log "installed $("$PREFIX/bin/pip" show gpu-autoscaler | awk '/^Version:/ {print $2}')"

# An image must not carry one build's identity into every VM started from it.
rm -rf "$STAGING"
cloud-init clean --logs --seed 2>/dev/null || true
