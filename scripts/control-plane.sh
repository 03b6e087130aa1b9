#!/usr/bin/env bash
# Builds the real Kubernetes control plane (kube-apiserver, kube-controller-manager, kubectl)
# from the Go module k8s.io/kubernetes, once per version, into a cache directory.
#
#   scripts/control-plane.sh                     # build if missing, print the bin directory
#   scripts/control-plane.sh kubelet kube-proxy  # the same, plus these commands (a real node)
#
# Why a generated tools module: k8s.io/kubernetes points every k8s.io/<staging> module at
# ./staging and requires it at v0.0.0, so a module that depends on it must replace each staging
# module with its published v0.<minor>.<patch> twin. The list comes from the downloaded go.mod.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.37.2}"
CACHE_ROOT="${LOXI_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/loxi-ccm}"
BIN_DIR="$CACHE_ROOT/k8s-$K8S_VERSION/bin"
BINARIES=(kube-apiserver kube-controller-manager kubectl "$@")

have_all() {
  for b in "${BINARIES[@]}"; do [ -x "$BIN_DIR/$b" ] || return 1; done
}

if have_all; then
  echo "$BIN_DIR"
  exit 0
fi

command -v go >/dev/null || { echo "control-plane: go toolchain not found" >&2; exit 1; }

MOD_DIR="$CACHE_ROOT/k8s-$K8S_VERSION/tools-module"
mkdir -p "$MOD_DIR" "$BIN_DIR"
cd "$MOD_DIR"

echo "control-plane: building Kubernetes $K8S_VERSION into $BIN_DIR (cold: several minutes)" >&2
gomod_path=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
[ -n "$gomod_path" ] || { echo "control-plane: could not download k8s.io/kubernetes@$K8S_VERSION" >&2; exit 1; }

minor_patch="${K8S_VERSION#v1.}"           # 37.2
staging_version="v0.${minor_patch}"         # v0.37.2
go_directive=$(sed -n 's/^go \(.*\)$/\1/p' "$gomod_path" | head -1)

{
  echo "module loxi-ccm-control-plane"
  echo
  echo "go ${go_directive}"
  echo
  echo "require k8s.io/kubernetes $K8S_VERSION"
  echo
  echo "replace ("
  # Every "k8s.io/x => ./staging/src/k8s.io/x" line becomes "k8s.io/x => k8s.io/x v0.Y.Z".
  sed -n 's#^[[:space:]]*\(k8s.io/[^ ]*\) => ./staging/src/.*#\t\1 => \1 '"$staging_version"'#p' "$gomod_path"
  echo ")"
} > go.mod
{
  echo "//go:build tools"
  echo
  echo "package tools"
  echo
  echo "import ("
  for b in "${BINARIES[@]}"; do echo "	_ \"k8s.io/kubernetes/cmd/$b\""; done
  echo ")"
} > tools.go

GOFLAGS=-mod=mod go mod tidy -e >/dev/null 2>&1 || true
for b in "${BINARIES[@]}"; do
  if [ ! -x "$BIN_DIR/$b" ]; then
    echo "control-plane: go build $b" >&2
    GOFLAGS=-mod=mod go build -trimpath -ldflags="-s -w" -o "$BIN_DIR/$b.tmp" "k8s.io/kubernetes/cmd/$b"
    mv "$BIN_DIR/$b.tmp" "$BIN_DIR/$b"
  fi
done
echo "$BIN_DIR"
