#!/usr/bin/env bash
# Make sure Azurite, Microsoft's Azure Storage emulator (the npm package `azurite`), is
# installed under the user's cache directory (outside the repository) for the artifact
# store tests on Azure Blob (tests/artifacts/test_store.py, tests/agent/test_carry.py).
# The test harness starts `azurite-blob` on 127.0.0.1 with a temporary directory.
# Prints the path of the `azurite-blob` executable.
#
# Needs node (>= 18) and npm, from Debian's packages if missing.
# Idempotent: a working install is reused as is (stamp file); a half-made one (an
# interrupted first install) is rebuilt. AZURITE_VERSION overrides the version.
set -euo pipefail
VERSION="${AZURITE_VERSION:-3.35.0}"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/gpu-autoscaler-tests"
PREFIX="$CACHE/azurite-$VERSION"
STAMP="$PREFIX/.installed"
BIN="$PREFIX/node_modules/.bin/azurite-blob"
say() { echo "ensure-azurite: $*" >&2; }

if [ -f "$STAMP" ] && [ -x "$BIN" ]; then
  echo "$BIN"
  exit 0
fi
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  if ! command -v apt-get >/dev/null 2>&1; then
    say "node and npm are missing and apt-get is not available; install Node.js 18+ and npm by hand"
    exit 1
  fi
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  say "installing Debian's nodejs and npm"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y --no-install-recommends nodejs npm >/dev/null
fi
say "installing azurite $VERSION into $PREFIX (once; reused afterwards)"
rm -rf "$PREFIX"
mkdir -p "$PREFIX"
if ! npm install --prefix "$PREFIX" --no-audit --no-fund --loglevel=error "azurite@$VERSION" >&2; then
  say "npm could not install azurite@$VERSION"
  rm -rf "$PREFIX"
  exit 1
fi
"$BIN" --version >/dev/null
touch "$STAMP"
echo "$BIN"
