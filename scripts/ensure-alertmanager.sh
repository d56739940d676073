#!/usr/bin/env bash
# Prometheus Alertmanager for the test suite (tests/notify starts its own on 127.0.0.1
# and reads the delivered alerts back from its API; nothing is started here).
set -euo pipefail
if command -v prometheus-alertmanager >/dev/null 2>&1; then
  exit 0
fi
echo "installing prometheus-alertmanager (for the test suite)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends prometheus-alertmanager >/dev/null
# The package enables a system service on :9093; the tests use their own instance.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet prometheus-alertmanager 2>/dev/null; then
  systemctl disable --now prometheus-alertmanager >/dev/null 2>&1 || true
fi
