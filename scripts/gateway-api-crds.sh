#!/usr/bin/env bash
# Fetches the upstream Gateway API CRDs (standard and experimental channels, `config/crd/`)
# from the Go module sigs.k8s.io/gateway-api, once per version, into a cache directory, and
# prints that directory (it holds `standard/` and `experimental/`).
#
#   scripts/gateway-api-crds.sh        # GATEWAY_API_VERSION overrides the pinned version
#
# The Go module proxy serves the module's source as it was tagged, so the CRDs are the ones
# upstream releases; the cache sits beside the Kubernetes binaries of scripts/control-plane.sh.
set -euo pipefail

GATEWAY_API_VERSION="${GATEWAY_API_VERSION:-v1.6.3}"
CACHE_ROOT="${LOXI_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/loxi-ccm}"
DIR="$CACHE_ROOT/gateway-api-$GATEWAY_API_VERSION"

if [ -f "$DIR/.complete" ]; then
  echo "$DIR"
  exit 0
fi

command -v go >/dev/null || { echo "gateway-api-crds: go toolchain not found" >&2; exit 1; }

# Outside any module of ours, with the module cache's default settings.
module_dir=$(cd "${TMPDIR:-/tmp}" && GOFLAGS= go mod download -json "sigs.k8s.io/gateway-api@$GATEWAY_API_VERSION" \
  | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -n "$module_dir" ] && [ -d "$module_dir/config/crd" ] \
  || { echo "gateway-api-crds: could not download sigs.k8s.io/gateway-api@$GATEWAY_API_VERSION" >&2; exit 1; }

rm -rf "$DIR.tmp"
mkdir -p "$DIR.tmp"
for channel in standard experimental; do
  mkdir -p "$DIR.tmp/$channel"
  cp "$module_dir/config/crd/$channel/"*.yaml "$DIR.tmp/$channel/"
done
# The module cache's files are read-only; the cache copy is ours to remove.
chmod -R u+w "$DIR.tmp"
touch "$DIR.tmp/.complete"
rm -rf "$DIR"
mv "$DIR.tmp" "$DIR"
echo "$DIR"
