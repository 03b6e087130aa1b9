#!/usr/bin/env bash
# Builds the upstream Gateway API conformance suite (the Go test package of the module
# sigs.k8s.io/gateway-api/conformance, which replaces sigs.k8s.io/gateway-api by `../`) into
# one test binary, once per version, and prints its path. `cargo xtask conformance` runs it.
#
#   scripts/gateway-api-conformance.sh   # GATEWAY_API_VERSION overrides the pinned version
set -euo pipefail

GATEWAY_API_VERSION="${GATEWAY_API_VERSION:-v1.6.3}"
CACHE_ROOT="${LOXI_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/loxi-ccm}"
DIR="$CACHE_ROOT/gateway-api-conformance-$GATEWAY_API_VERSION"
BIN="$DIR/conformance.test"

if [ -x "$BIN" ]; then
  echo "$BIN"
  exit 0
fi

command -v go >/dev/null || { echo "gateway-api-conformance: go toolchain not found" >&2; exit 1; }

module_dir() {
  (cd "${TMPDIR:-/tmp}" && GOFLAGS= go mod download -json "$1@$GATEWAY_API_VERSION" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
}
main=$(module_dir sigs.k8s.io/gateway-api)
conformance=$(module_dir sigs.k8s.io/gateway-api/conformance)
[ -n "$main" ] && [ -n "$conformance" ] \
  || { echo "gateway-api-conformance: could not download sigs.k8s.io/gateway-api{,/conformance}@$GATEWAY_API_VERSION" >&2; exit 1; }

# The layout the conformance module's `replace ... => ../` expects, writable (the module
# cache is read-only); the repository's go.work is left out (GOWORK=off).
src="$DIR.src"
rm -rf "$src"
mkdir -p "$DIR"
cp -r "$main" "$src"
chmod -R u+w "$src"
rm -rf "$src/conformance"
cp -r "$conformance" "$src/conformance"
chmod -R u+w "$src/conformance"
echo "gateway-api-conformance: building the suite $GATEWAY_API_VERSION (cold: several minutes)" >&2
(cd "$src/conformance" && GOWORK=off GOFLAGS=-mod=mod go test -c -o "$BIN.tmp" .)
mv "$BIN.tmp" "$BIN"
rm -rf "$src"
echo "$BIN"
