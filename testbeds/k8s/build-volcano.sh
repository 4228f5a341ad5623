#!/usr/bin/env bash
# Build the Volcano gang scheduler for the Kubernetes testbed (testbeds/k8s/volcano.py).
#
#   vc-scheduler           volcano.sh/volcano cmd/scheduler
#   vc-controller-manager  volcano.sh/volcano cmd/controller-manager
#
# Both come from the Go module source volcano.sh/volcano@$VOLCANO_VERSION (the
# newest version the module proxy serves us), built inside a writable copy of
# the module so that its go.mod replace directives (k8s.io/* pinned to v0.30.x)
# apply, in ONE `go build` so the shared packages compile once.
# Go 1.26 builds v1.10.0 as published: no go.mod bumps were needed.
# Time on 2 cores: ~2.5 min (module downloads included), ~2 min even with an
# empty Go build cache: none of it is shared with build.sh's k8s v1.33.
# The webhook-manager is not built: the testbed creates PodGroups and Queues
# itself, and nothing the testbed uses needs admission/defaulting webhooks.
#
# The CRDs the two binaries watch (scheduling.volcano.sh PodGroup + Queue,
# batch.volcano.sh Job, bus.volcano.sh Command, nodeinfo.volcano.sh
# Numatopology) are copied from the module source into $CACHE/share, so a
# testbed starts without network.
#
# Output: $MPILAUNCH_K8S_CACHE/bin/vc-{scheduler,controller-manager}-<version>
#         $MPILAUNCH_K8S_CACHE/share/volcano-<version>/crd/*.yaml
# The Go caches are shared with build.sh ($MPILAUNCH_CACHE/mpilaunch-go).
# Idempotent: binaries already there are smoke-checked (`--version`) and
# rebuilt only when missing or broken.
#
# Usage: build-volcano.sh [--print-bindir]
set -euo pipefail

VOLCANO_VERSION="${VOLCANO_VERSION:-v1.10.0}"
ROOT_CACHE="${MPILAUNCH_CACHE:-$HOME/.cache}"
CACHE="${MPILAUNCH_K8S_CACHE:-$ROOT_CACHE/mpilaunch-k8s}"
BIN="$CACHE/bin"
SRC="$CACHE/src/volcano-$VOLCANO_VERSION"
SHARE="$CACHE/share/volcano-$VOLCANO_VERSION"
CMDS=(scheduler controller-manager)

if [[ "${1:-}" == "--print-bindir" ]]; then echo "$BIN"; exit 0; fi

log() { echo "[volcano-build $(date +%H:%M:%S)] $*"; }

ok() {  # ok NAME -> the cached binary exists and runs
    local bin="$BIN/vc-$1-$VOLCANO_VERSION"
    [[ -x "$bin" ]] && "$bin" --version >/dev/null 2>&1
}

all_ok=1
for c in "${CMDS[@]}"; do ok "$c" || all_ok=0; done
if [[ $all_ok == 1 && -s "$SHARE/crd/scheduling.volcano.sh_podgroups.yaml" ]]; then
    log "volcano $VOLCANO_VERSION: cached"
    exit 0
fi
command -v go >/dev/null || { echo "build-volcano.sh: go not found in PATH" >&2; exit 1; }

export GOCACHE="${MPILAUNCH_GOCACHE:-$ROOT_CACHE/mpilaunch-go/build}"
export GOMODCACHE="${MPILAUNCH_GOMODCACHE:-$ROOT_CACHE/mpilaunch-go/mod}"
# -modcacherw: a throw-away MPILAUNCH_CACHE can be removed with plain rm -rf
export CGO_ENABLED=0 GOFLAGS="-mod=mod -modcacherw" GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
mkdir -p "$BIN" "$SHARE/crd"
t0=$SECONDS

if [[ ! -f "$SRC/go.mod" ]]; then
    log "fetching volcano.sh/volcano@$VOLCANO_VERSION source"
    MODDIR="$(cd "$(mktemp -d)" && go mod download -json "volcano.sh/volcano@$VOLCANO_VERSION" \
        | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
    [[ -d "$MODDIR" ]] || { echo "build-volcano.sh: module download failed" >&2; exit 1; }
    rm -rf "$SRC.tmp" && mkdir -p "$(dirname "$SRC")"
    cp -r "$MODDIR" "$SRC.tmp" && chmod -R u+w "$SRC.tmp"
    mv "$SRC.tmp" "$SRC"
fi

# CRDs (v1 apiextensions, as the Helm chart installs them).
cp -f "$SRC"/installer/helm/chart/volcano/crd/bases/*.yaml "$SHARE/crd/"

log "building vc-scheduler, vc-controller-manager $VOLCANO_VERSION"
# Version info for --version (what Volcano's Makefile passes).
PKG=volcano.sh/volcano/pkg/version
LDFLAGS="-s -w -X $PKG.Version=$VOLCANO_VERSION -X $PKG.GitSHA=module -X $PKG.Built=mpilaunch"
mkdir -p "$SRC/_out"
(cd "$SRC" && go build -trimpath -gcflags=all=-dwarf=false -ldflags="$LDFLAGS" -o "$SRC/_out/" ./cmd/scheduler ./cmd/controller-manager)
for c in "${CMDS[@]}"; do
    out="$BIN/vc-$c-$VOLCANO_VERSION"
    mv -f "$SRC/_out/$c" "$out.tmp.$$" && mv -f "$out.tmp.$$" "$out"
    ln -sfn "vc-$c-$VOLCANO_VERSION" "$BIN/vc-$c"
    ok "$c" || { echo "build-volcano.sh: $out fails its smoke check (--version)" >&2; exit 1; }
done
log "installed vc-scheduler, vc-controller-manager $VOLCANO_VERSION in $((SECONDS - t0))s"
