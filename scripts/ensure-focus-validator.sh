#!/usr/bin/env bash
# Make sure the FinOps Foundation's FOCUS validator is installed, in a virtualenv of its
# own under the user's cache directory (outside the repository), for tests/test_focus_export.py.
# Its dependencies (pandas, pandera, sqlglot, ...) pin versions that clash with ours,
# hence the separate venv. Prints the path of the `focus-validator` executable.
#
# Why 1.0.0 and not 2.x: focus-validator 2.x needs Python >= 3.12 (Debian 12 has 3.11)
# and ships rules only for FOCUS 1.2+ (other versions are downloaded from GitHub at run
# time); 1.0.0 ships the FOCUS 1.0 rule set and runs offline. Its pandera 0.17 imports
# `multimethod.overload`, removed in multimethod 2, hence the `multimethod<2` pin.
#
# Idempotent: a working install is reused as is (stamp file); a half-made one (an
# interrupted first install) is rebuilt. FOCUS_VALIDATOR_VERSION overrides the version.
set -euo pipefail
VERSION="${FOCUS_VALIDATOR_VERSION:-1.0.0}"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/gpu-autoscaler-tests"
VENV="$CACHE/focus-validator-$VERSION"
STAMP="$VENV/.installed"
# The quick check finds the package without importing it (pandas takes seconds to load).
if [ -f "$STAMP" ] && [ -x "$VENV/bin/focus-validator" ] \
  && "$VENV/bin/python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('focus_validator') is None)" 2>/dev/null; then
  echo "$VENV/bin/focus-validator"
  exit 0
fi
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
echo "ensure-focus-validator: installing focus-validator $VERSION into $VENV (once; reused afterwards)" >&2
mkdir -p "$CACHE"
rm -rf "$VENV"
if ! "$PY" -m venv "$VENV"; then
  echo "ensure-focus-validator: '$PY -m venv' failed; install python3-venv (apt-get install python3.11-venv)" >&2
  exit 1
fi
if ! "$VENV/bin/pip" install --quiet --disable-pip-version-check "focus-validator==$VERSION" "multimethod<2" >&2; then
  echo "ensure-focus-validator: pip could not install focus-validator==$VERSION with multimethod<2" >&2
  rm -rf "$VENV"
  exit 1
fi
"$VENV/bin/python" -c "import focus_validator.main" >/dev/null
touch "$STAMP"
echo "$VENV/bin/focus-validator"
