#!/usr/bin/env bash
# Make sure `promtool` (Debian's `prometheus` package) is on PATH for tests/deploy/
# test_prometheus_rules.py: `promtool check rules` and `promtool test rules` on the
# shipped rules in deploy/prometheus/. Idempotent: installs only if missing.
set -euo pipefail

if command -v promtool >/dev/null 2>&1; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure-prometheus: promtool is missing and apt-get is not available; install Prometheus (>= 2.37) by hand" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "ensure-prometheus: installing Debian's prometheus (for promtool)" >&2
export DEBIAN_FRONTEND=noninteractive
if ! apt-cache show prometheus >/dev/null 2>&1; then
  $SUDO apt-get update -qq
fi
if ! $SUDO apt-get install -y --no-install-recommends prometheus >/dev/null; then
  # The package list may be stale; refresh once and retry.
  $SUDO apt-get update -qq
  $SUDO apt-get install -y --no-install-recommends prometheus >/dev/null
fi
# The package starts a Prometheus server on :9090; the tests need only promtool.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet prometheus 2>/dev/null; then
  $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
command -v promtool >/dev/null
