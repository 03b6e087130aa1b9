#!/usr/bin/env bash
# Builds one Go command-line tool the tests need (helm, promtool) from its Go module, once per
# version, into a cache directory, and prints the path of the binary.
#
#   scripts/go-tool.sh helm        # helm.sh/helm/v3/cmd/helm
#   scripts/go-tool.sh promtool    # github.com/prometheus/prometheus/cmd/promtool
#   scripts/go-tool.sh actionlint  # github.com/rhysd/actionlint/cmd/actionlint
#
# Versions are pinned here (HELM_VERSION / PROMTOOL_VERSION override them) so every machine and
# CI builds the same tool; the cache sits beside the Kubernetes binaries of
# scripts/control-plane.sh. A failed build exits non-zero with go's own message: the callers
# (cargo xtask test, the chart tests) fail loudly rather than skip.
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.22.0}"
PROMTOOL_VERSION="${PROMTOOL_VERSION:-v0.316.0}"
ACTIONLINT_VERSION="${ACTIONLINT_VERSION:-v1.7.12}"
CACHE_ROOT="${LOXI_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/loxi-ccm}"

tool="${1:-}"
tags=""
case "$tool" in
  helm)
    version="$HELM_VERSION"
    package="helm.sh/helm/v3/cmd/helm"
    ;;
  promtool)
    version="$PROMTOOL_VERSION"
    package="github.com/prometheus/prometheus/cmd/promtool"
    # The tests only check and unit-test rule files: leave out Prometheus' service-discovery
    # plugins (cloud SDKs), which are most of a cold build.
    tags="remove_all_sd"
    ;;
  actionlint)
    version="$ACTIONLINT_VERSION"
    package="github.com/rhysd/actionlint/cmd/actionlint"
    ;;
  *)
    echo "usage: $0 helm|promtool|actionlint" >&2
    exit 2
    ;;
esac

BIN_DIR="$CACHE_ROOT/$tool-$version/bin"
if [ -x "$BIN_DIR/$tool" ]; then
  echo "$BIN_DIR/$tool"
  exit 0
fi

command -v go >/dev/null || { echo "go-tool: go toolchain not found, cannot build $tool" >&2; exit 1; }

mkdir -p "$BIN_DIR"
# One build at a time per tool (tests running side by side may all ask at once on a cold cache).
exec 9>"$CACHE_ROOT/.$tool-$version.lock"
flock 9
if [ -x "$BIN_DIR/$tool" ]; then
  echo "$BIN_DIR/$tool"
  exit 0
fi
rm -rf "$BIN_DIR.tmp"
echo "go-tool: building $tool $version into $BIN_DIR (cold: a few minutes)" >&2
# `go install pkg@version` builds with exactly the module's own go.mod and go.sum, no module of
# ours in between. GOFLAGS is cleared so a caller's -mod setting cannot change that.
GOFLAGS= GOBIN="$BIN_DIR.tmp" go install -trimpath -tags="$tags" -ldflags="-s -w" "$package@$version"
mv "$BIN_DIR.tmp/$tool" "$BIN_DIR/$tool"
rmdir "$BIN_DIR.tmp" 2>/dev/null || true
echo "$BIN_DIR/$tool"
