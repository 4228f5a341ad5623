#!/usr/bin/env bash
# Build Kubeflow's mpi-operator (the peer issue 53 measures mpilaunch against)
# for the real-node testbed (testbeds/k8s/mpi_operator.py).
#
#   mpi-operator  github.com/kubeflow/mpi-operator cmd/mpi-operator
#
# From the Go module source github.com/kubeflow/mpi-operator@$MPI_OPERATOR_VERSION
# (v0.8.2: the newest v0.8.x the module proxy serves us; v0.8.1 answers 403),
# built inside a writable copy of the module so that its own go.mod (client-go
# 0.35, Go 1.26) applies. It cannot join build.sh's graphs: Kubernetes 1.33's
# is at client-go 0.33 and kwok's at 0.36, and the controller is built against
# 0.35's generated clients. The Go build and module caches are build.sh's
# ($MPILAUNCH_CACHE/mpilaunch-go), so the standard library and every module
# version the graphs share compile once.
#
# Also copied out of the module source, as data: the MPIJob CRD
# (manifests/base/kubeflow.org_mpijobs.yaml) and the operator's ClusterRole
# (manifests/base/cluster-role.yaml), so a testbed starts without network.
#
# Output: $MPILAUNCH_K8S_CACHE/bin/mpi-operator-<version>
#         $MPILAUNCH_K8S_CACHE/share/mpi-operator-<version>/{kubeflow.org_mpijobs,cluster-role}.yaml
# Idempotent: a binary already there is smoke-checked (`--help` names its
# flags) and rebuilt only when missing or broken.
#
# Usage: build-mpi-operator.sh [--print-bindir]
set -euo pipefail

MPI_OPERATOR_VERSION="${MPI_OPERATOR_VERSION:-v0.8.2}"
MOD=github.com/kubeflow/mpi-operator
ROOT_CACHE="${MPILAUNCH_CACHE:-$HOME/.cache}"
CACHE="${MPILAUNCH_K8S_CACHE:-$ROOT_CACHE/mpilaunch-k8s}"
BIN="$CACHE/bin"
SRC="$CACHE/src/mpi-operator-$MPI_OPERATOR_VERSION"
SHARE="$CACHE/share/mpi-operator-$MPI_OPERATOR_VERSION"
OUT="$BIN/mpi-operator-$MPI_OPERATOR_VERSION"

if [[ "${1:-}" == "--print-bindir" ]]; then echo "$BIN"; exit 0; fi

log() { echo "[mpi-operator-build $(date +%H:%M:%S)] $*"; }

# the binary runs and knows its own flags (klog's and the operator's)
ok() { [[ -x "$OUT" ]] && "$OUT" --help 2>&1 | grep -q -- '-gang-scheduling'; }

if ok && [[ -s "$SHARE/kubeflow.org_mpijobs.yaml" && -s "$SHARE/cluster-role.yaml" ]]; then
    log "mpi-operator $MPI_OPERATOR_VERSION: cached"
    exit 0
fi
command -v go >/dev/null || { echo "build-mpi-operator.sh: go not found in PATH" >&2; exit 1; }

export GOCACHE="${MPILAUNCH_GOCACHE:-$ROOT_CACHE/mpilaunch-go/build}"
export GOMODCACHE="${MPILAUNCH_GOMODCACHE:-$ROOT_CACHE/mpilaunch-go/mod}"
# -modcacherw: a throw-away MPILAUNCH_CACHE can be removed with plain rm -rf
export CGO_ENABLED=0 GOFLAGS="-mod=mod -modcacherw" GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
mkdir -p "$BIN" "$SHARE"
t0=$SECONDS

if [[ ! -f "$SRC/go.mod" ]]; then
    log "fetching $MOD@$MPI_OPERATOR_VERSION source"
    MODDIR="$(cd "$(mktemp -d)" && go mod download -json "$MOD@$MPI_OPERATOR_VERSION" \
        | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
    [[ -d "$MODDIR" ]] || { echo "build-mpi-operator.sh: module download failed ($MOD@$MPI_OPERATOR_VERSION)" >&2; exit 1; }
    rm -rf "$SRC.tmp" && mkdir -p "$(dirname "$SRC")"
    cp -r "$MODDIR" "$SRC.tmp" && chmod -R u+w "$SRC.tmp"
    mv "$SRC.tmp" "$SRC"
fi

cp -f "$SRC/manifests/base/kubeflow.org_mpijobs.yaml" "$SRC/manifests/base/cluster-role.yaml" "$SHARE/"

log "building mpi-operator $MPI_OPERATOR_VERSION"
# version info, as the project's Makefile passes it
PKG=$MOD/pkg/version
LDFLAGS="-s -w -X $PKG.GitSHA=module -X $PKG.Built=mpilaunch -X $PKG.Version=$MPI_OPERATOR_VERSION"
(cd "$SRC" && go build -trimpath -gcflags=all=-dwarf=false -ldflags="$LDFLAGS" -o "$OUT.tmp.$$" ./cmd/mpi-operator)
mv -f "$OUT.tmp.$$" "$OUT"
ln -sfn "mpi-operator-$MPI_OPERATOR_VERSION" "$BIN/mpi-operator"
ok || { echo "build-mpi-operator.sh: $OUT fails its smoke check (--help)" >&2; exit 1; }
log "installed mpi-operator $MPI_OPERATOR_VERSION in $((SECONDS - t0))s"
