#!/usr/bin/env bash
# Make sure checkov is installed in its own virtualenv, .venv-checkov (git-ignored),
# for tests/deploy. Its dependency tree is large and pins versions that clash with the
# project's, hence the separate venv. Idempotent: installs only if missing.
# The tests always run it with --skip-download (no network at scan time).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv-checkov/bin/checkov ]; then
  exit 0
fi
echo "ensure-checkov: creating .venv-checkov" >&2
python3 -m venv .venv-checkov
.venv-checkov/bin/pip install --quiet --disable-pip-version-check checkov
.venv-checkov/bin/checkov --version >/dev/null
