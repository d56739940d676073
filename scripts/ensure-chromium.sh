#!/usr/bin/env bash
# Make sure Debian's headless Chromium is installed for the dashboard tests (tests/web).
# Playwright's own browser download is not available offline, so the tests drive this
# executable through playwright's `executable_path`. Idempotent: installs only if missing.
set -euo pipefail

if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure-chromium: chromium is missing and apt-get is not available; install Chromium by hand" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "ensure-chromium: installing Debian's chromium" >&2
export DEBIAN_FRONTEND=noninteractive
if ! apt-cache show chromium >/dev/null 2>&1; then
  $SUDO apt-get update -qq
fi
if ! $SUDO apt-get install -y --no-install-recommends chromium chromium-driver fonts-dejavu-core >/dev/null; then
  # The package list may be stale; refresh once and retry.
  $SUDO apt-get update -qq
  $SUDO apt-get install -y --no-install-recommends chromium chromium-driver fonts-dejavu-core >/dev/null
fi
command -v chromium >/dev/null
