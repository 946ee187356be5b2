#!/usr/bin/env bash
# Builds kube-apiserver from the Go module proxy into .tools/kube (cached by version).
# k8s.io/kubernetes' go.mod points its staging modules at ./staging, which a module
# download does not have, so a wrapper module replaces each with the published v0.x.
set -euo pipefail
VERSION="${KUBE_VERSION:-1.34.4}"
STAGING="v0.${VERSION#1.}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="$ROOT/.tools/kube/$VERSION"
if [ -x "$OUT/kube-apiserver" ]; then echo "$OUT/kube-apiserver"; exit 0; fi
command -v go >/dev/null || { echo "kube-apiserver.sh: go is not on PATH (install Go 1.24+)" >&2; exit 1; }
WORK="$(mktemp -d)"; trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
curl -fsSL "https://proxy.golang.org/k8s.io/kubernetes/@v/v$VERSION.mod" -o upstream.mod
{
  echo "module slipway.dev/kube-build"
  echo "go 1.24"
  echo "require k8s.io/kubernetes v$VERSION"
  grep -o 'k8s.io/[a-z0-9-]* => ./staging' upstream.mod | awk -v v="$STAGING" '{print "replace " $1 " => " $1 " " v}'
} > go.mod
cat > tools.go <<'GO'
//go:build tools
package tools
import _ "k8s.io/kubernetes/cmd/kube-apiserver"
GO
GOFLAGS=-mod=mod go mod tidy >/dev/null 2>&1 || GOFLAGS=-mod=mod go get "k8s.io/kubernetes/cmd/kube-apiserver@v$VERSION"
mkdir -p "$OUT.tmp"
GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$OUT.tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
rm -rf "$OUT"; mv "$OUT.tmp" "$OUT"
echo "$OUT/kube-apiserver"
