#!/usr/bin/env bash
# Make sure a single-node Slurm cluster can be started by the test harness
# (tests/fakes/slurm.py): slurmctld, slurmd, the client commands and munge.
# Debian's Slurm 22.05 without recommends is 8 small packages. Idempotent:
# installs only what is missing, refreshes the package list at most once.
set -euo pipefail

need=()
for bin in slurmctld slurmd sbatch squeue scancel munged mungekey; do
  command -v "$bin" >/dev/null 2>&1 || need+=("$bin")
done
if [ "${#need[@]}" -eq 0 ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure-slurm: missing ${need[*]} and apt-get is not available; install slurmctld, slurmd, slurm-client and munge by hand" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
PKGS=(slurmctld slurmd slurm-client munge)
echo "ensure-slurm: installing ${PKGS[*]} (missing: ${need[*]})" >&2
export DEBIAN_FRONTEND=noninteractive
if ! apt-cache show slurmctld >/dev/null 2>&1; then
  $SUDO apt-get update -qq
fi
# The packages' own service start is refused in containers; that is harmless here
# because the harness starts the daemons itself, so the install's exit status is
# judged by whether the binaries are there afterwards.
if ! $SUDO apt-get install -y --no-install-recommends "${PKGS[@]}" >/dev/null; then
  $SUDO apt-get update -qq
  $SUDO apt-get install -y --no-install-recommends "${PKGS[@]}" >/dev/null || true
fi
for bin in slurmctld slurmd sbatch squeue scancel munged mungekey; do
  if ! command -v "$bin" >/dev/null 2>&1; then
    echo "ensure-slurm: $bin still missing after installing ${PKGS[*]}" >&2
    exit 1
  fi
done
