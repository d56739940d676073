#!/usr/bin/env bash
# PostgreSQL server binaries for the test suite (the suite starts its own throwaway
# server on 127.0.0.1; nothing is started here).
set -euo pipefail
if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  exit 0
fi
echo "installing PostgreSQL (for the test suite)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends postgresql >/dev/null
