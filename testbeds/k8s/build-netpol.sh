#!/usr/bin/env bash
# Build the NetworkPolicy enforcer of the Kubernetes testbed's real node
# (testbeds/k8s/netpol.py): kube-router's policy controller.
#
#   kube-router   github.com/cloudnativelabs/kube-router/v2 cmd/kube-router
#
# Only its firewall (NetworkPolicy) controller runs (--run-firewall, no router,
# no service proxy): iptables chains + ipsets, which this machine's kernel has.
# kube-network-policies (sigs.k8s.io, v0.8.0) was tried and cannot work here:
# it programs nftables `queue` rules, and this kernel has no CONFIG_NFT_QUEUE
# (testbeds/k8s/README.md, "NetworkPolicy").
#
# v2.1.0 is the version the Go module proxy serves us. Security flaws are
# reported against it: acceptable only for this local testbed, whose pods
# run the project's own images on a bridge that reaches nothing outside.
# Built from the published module as it is (its go.mod has no replace
# directives), with `go install pkg@version`.
# Time on 2 cores: ~3 min with an empty Go build cache (module downloads included).
#
# Output: $MPILAUNCH_K8S_CACHE/bin/kube-router-<version> (+ symlink kube-router).
# The Go caches are shared with build.sh ($MPILAUNCH_CACHE/mpilaunch-go).
# Idempotent: a binary already there is smoke-checked (`--version`) and
# rebuilt only when missing or broken.
#
# Usage: build-netpol.sh [--print-bin]
set -euo pipefail

KUBE_ROUTER_VERSION="${KUBE_ROUTER_VERSION:-v2.1.0}"
ROOT_CACHE="${MPILAUNCH_CACHE:-$HOME/.cache}"
CACHE="${MPILAUNCH_K8S_CACHE:-$ROOT_CACHE/mpilaunch-k8s}"
BIN="$CACHE/bin"
OUT="$BIN/kube-router-$KUBE_ROUTER_VERSION"

if [[ "${1:-}" == "--print-bin" ]]; then echo "$OUT"; exit 0; fi

log() { echo "[netpol-build $(date +%H:%M:%S)] $*"; }

ok() {  # the cached binary exists and says its version
    [[ -x "$OUT" ]] && "$OUT" --version 2>&1 | grep -q "$KUBE_ROUTER_VERSION"
}

if ok; then log "kube-router $KUBE_ROUTER_VERSION: cached"; exit 0; fi
command -v go >/dev/null || { echo "build-netpol.sh: go not found in PATH" >&2; exit 1; }

export GOCACHE="${MPILAUNCH_GOCACHE:-$ROOT_CACHE/mpilaunch-go/build}"
export GOMODCACHE="${MPILAUNCH_GOMODCACHE:-$ROOT_CACHE/mpilaunch-go/mod}"
# -modcacherw: a throw-away MPILAUNCH_CACHE can be removed with plain rm -rf
export CGO_ENABLED=0 GOFLAGS="-modcacherw" GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
mkdir -p "$BIN"
t0=$SECONDS
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

log "building kube-router $KUBE_ROUTER_VERSION"
PKG=github.com/cloudnativelabs/kube-router/v2
# what its Makefile passes, so --version names the version
LDFLAGS="-s -w -X $PKG/pkg/version.Version=$KUBE_ROUTER_VERSION -X $PKG/pkg/version.BuildDate=mpilaunch"
(cd "$tmp" && GOBIN="$tmp" go install -trimpath -gcflags=all=-dwarf=false -ldflags="$LDFLAGS" \
    "$PKG/cmd/kube-router@$KUBE_ROUTER_VERSION")
mv -f "$tmp/kube-router" "$OUT.tmp.$$" && mv -f "$OUT.tmp.$$" "$OUT"
ln -sfn "kube-router-$KUBE_ROUTER_VERSION" "$BIN/kube-router"
ok || { echo "build-netpol.sh: $OUT fails its smoke check (--version): $("$OUT" --version 2>&1 | tail -1)" >&2; exit 1; }
log "installed $OUT in $((SECONDS - t0))s"
