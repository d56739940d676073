#!/usr/bin/env bash
# Make sure checkov is installed in its own virtualenv, .venv-checkov (git-ignored),
# for tests/deploy. Its dependency tree is large and pins versions that clash with the
# project's, hence the separate venv. Idempotent: a working install is reused as is; a
# half-made one (an interrupted first install) is rebuilt. The version is pinned so a
# fresh machine scans with the same rules as this one (a newer checkov adds checks).
# The tests always run it with --skip-download (no network at scan time).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION="${CHECKOV_VERSION:-3.3.30}"
VENV=.venv-checkov
STAMP="$VENV/.installed-$VERSION"
if [ -f "$STAMP" ] && "$VENV/bin/checkov" --version >/dev/null 2>&1; then
  exit 0
fi
# An install made before the stamp existed: keep it if it is the pinned version.
if [ "$("$VENV/bin/checkov" --version 2>/dev/null || true)" = "$VERSION" ]; then
  touch "$STAMP"
  exit 0
fi
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
echo "ensure-checkov: installing checkov $VERSION into $VENV (once; reused afterwards)" >&2
rm -rf "$VENV"
if ! "$PY" -m venv "$VENV"; then
  echo "ensure-checkov: '$PY -m venv' failed; install python3-venv (apt-get install python3.11-venv)" >&2
  exit 1
fi
"$VENV/bin/pip" install --quiet --disable-pip-version-check "checkov==$VERSION"
"$VENV/bin/checkov" --version >/dev/null
touch "$STAMP"
