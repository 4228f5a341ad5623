#!/usr/bin/env bash
# Build a small CoreDNS for the real-pod node of the Kubernetes testbed.
#
# A wrapper main imports only the plugins the testbed's Corefile uses
# (bind, kubernetes, hosts, errors, health, ready, log): the full CoreDNS pulls in
# every cloud SDK and takes many minutes more to build on 2 cores.
# The Go caches are shared with build.sh ($MPILAUNCH_CACHE/mpilaunch-go).
#
# Output: $MPILAUNCH_K8S_CACHE/bin/coredns-<version> (+ symlink coredns).
# Idempotent: a binary already there is not rebuilt.
set -euo pipefail

COREDNS_VERSION="${COREDNS_VERSION:-v1.12.1}"
ROOT_CACHE="${MPILAUNCH_CACHE:-$HOME/.cache}"
CACHE="${MPILAUNCH_K8S_CACHE:-$ROOT_CACHE/mpilaunch-k8s}"
BIN="$CACHE/bin"
SRC="$CACHE/src/coredns-$COREDNS_VERSION"
OUT="$BIN/coredns-$COREDNS_VERSION"

log() { echo "[coredns-build $(date +%H:%M:%S)] $*"; }
if [[ -x "$OUT" ]]; then log "coredns $COREDNS_VERSION: cached"; exit 0; fi
command -v go >/dev/null || { echo "build-coredns.sh: go not found in PATH" >&2; exit 1; }

export GOCACHE="${MPILAUNCH_GOCACHE:-$ROOT_CACHE/mpilaunch-go/build}"
export GOMODCACHE="${MPILAUNCH_GOMODCACHE:-$ROOT_CACHE/mpilaunch-go/mod}"
export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
mkdir -p "$BIN" "$SRC"

cat >"$SRC/main.go" <<'GO'
// Command coredns: CoreDNS with only the plugins the testbed needs.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

// The order plugins run in (dnsserver's full list names plugins that are
// not compiled in; caddy only needs the ones a Corefile uses to be known).
func init() {
	dnsserver.Directives = []string{"bind", "errors", "log", "health", "ready", "hosts", "kubernetes"}
}

func main() { coremain.Run() }
GO
printf 'module mpilaunch.local/corednswrapper\n\ngo 1.23.0\n\nrequire github.com/coredns/coredns %s\n' \
    "$COREDNS_VERSION" >"$SRC/go.mod"
log "building coredns $COREDNS_VERSION (bind, kubernetes, hosts, errors, log, health, ready)"
t0=$SECONDS
(cd "$SRC" && go mod tidy && go build -trimpath -gcflags=all=-dwarf=false -ldflags="-s -w" -o "$SRC/coredns.out" .)
mv -f "$SRC/coredns.out" "$OUT.tmp.$$" && mv -f "$OUT.tmp.$$" "$OUT"
ln -sfn "coredns-$COREDNS_VERSION" "$BIN/coredns"
log "installed $OUT in $((SECONDS - t0))s"
