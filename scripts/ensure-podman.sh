#!/usr/bin/env bash
# Make sure podman (with runc and its catatonit init), debootstrap, iptables, Debian's docker-registry and
# busybox-static are installed, and that a
# Debian root filesystem for the agent image test (tests/deploy/test_install_agent.py)
# is cached as a tarball. The tarball is made once with debootstrap (it reaches
# Debian's package mirror) and reused by every later test session; podman imports it.
#
# Why these pieces (see docs/agent.md, "Testing the install script"): crun, podman's
# default runtime, refuses hybrid cgroup layouts, so the tests run `podman --runtime
# runc`; no image can be pulled from a registry, so the root filesystem is built here.
# The container task tests (tests/agent/test_container_tasks.py) push a busybox image
# to a docker-registry they start on 127.0.0.1 and have the agent pull it back.
#
# Idempotent: installs only what is missing; rebuilds the tarball only when absent.
# Environment:
#   AUTOSCALER_TEST_CACHE  where the tarball lives (default ~/.cache/gpu-autoscaler-tests)
#   DEBIAN_MIRROR          debootstrap mirror (default http://deb.debian.org/debian)
set -euo pipefail
CACHE="${AUTOSCALER_TEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-autoscaler-tests}"
TARBALL="$CACHE/debian-bookworm-agent-rootfs.tar"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# What install-agent.sh expects of a base image: Python >= 3.11 with venv, systemd's
# systemctl, iptables for the metadata guard, useradd (passwd), CA certificates.
INCLUDE="python3,python3-venv,python3-pip,systemd,iptables,passwd,ca-certificates,procps,iproute2"

say() { echo "ensure-podman: $*" >&2; }
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
command -v podman >/dev/null 2>&1 || missing+=(podman)
command -v runc >/dev/null 2>&1 || missing+=(runc)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
command -v iptables >/dev/null 2>&1 || missing+=(iptables)
command -v docker-registry >/dev/null 2>&1 || missing+=(docker-registry)
# `podman run --init` (how the agent runs container tasks) needs podman's init, only a
# Recommends of podman, which the --no-install-recommends install below leaves out.
[ -x /usr/libexec/podman/catatonit ] || missing+=(catatonit)
# The static build: the dynamic `busybox` package's binary cannot run in an empty image.
if ! dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q "install ok installed"; then
  missing+=(busybox-static)
fi
if [ "${#missing[@]}" -gt 0 ]; then
  if ! command -v apt-get >/dev/null 2>&1; then
    say "missing ${missing[*]} and apt-get is not available; install them by hand"
    exit 1
  fi
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ -s "$TARBALL" ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  say "building the test root filesystem needs root (debootstrap); skipping it"
  exit 0
fi
mkdir -p "$CACHE"
work="$(mktemp -d "$CACHE/rootfs.XXXXXX")"
trap 'rm -rf "$work"' EXIT
say "building a Debian bookworm root filesystem with debootstrap (once; cached in $CACHE)"
debootstrap --variant=minbase --include="$INCLUDE" bookworm "$work/rootfs" "$MIRROR" >"$work/debootstrap.log" 2>&1 || {
  tail -n 20 "$work/debootstrap.log" >&2
  say "debootstrap failed"
  exit 1
}
rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/lib/apt/lists/"*
tar -C "$work/rootfs" -cf "$work/rootfs.tar" .
mv "$work/rootfs.tar" "$TARBALL"
say "cached $TARBALL"
