#!/usr/bin/env bash
# Kueue's controller manager (cmd/kueue) for the Kubernetes testbed: its source and manifests.
#
# The source is the Go module sigs.k8s.io/kueue@$KUEUE_VERSION (fetched through
# the module proxy into the shared GOMODCACHE), copied writable to
# $CACHE/src/kueue-$KUEUE_VERSION, after a small testbed patch (two fixed cert
# paths made relocatable, a fallback for an unparseable server gitVersion, and
# no Kubeflow Trainer integration; see below).
# The CRDs, their conversion-webhook patches and the admission-webhook
# configurations are copied to $CACHE/share/kueue-$KUEUE_VERSION, so that
# kueue.py starts Kueue without any network.
# The binary is compiled by build.sh, in one go build with kwok: both stand on
# the same Kubernetes libraries (client-go, apiserver, API types, gRPC; 572 of
# kwok's 758 non-standard packages), which built apart compiled twice. So
# build.sh runs this script with --source-only first, and this script, run
# alone, runs `build.sh kueue` for the binary.
# The Go caches are shared with build.sh ($MPILAUNCH_CACHE/mpilaunch-go).
#
# Output: $MPILAUNCH_K8S_CACHE/bin/kueue-<version> (+ symlink kueue),
#         $MPILAUNCH_K8S_CACHE/share/kueue-<version>/{crds,crd-patches,webhook}/
# Idempotent: a binary and manifests already there are not rebuilt.
#
# Usage: build-kueue.sh [--source-only] [--print-srcdir]
set -euo pipefail

KUEUE_VERSION="${KUEUE_VERSION:-v0.17.0}"
ROOT_CACHE="${MPILAUNCH_CACHE:-$HOME/.cache}"
CACHE="${MPILAUNCH_K8S_CACHE:-$ROOT_CACHE/mpilaunch-k8s}"
BIN="$CACHE/bin"
SRC="$CACHE/src/kueue-$KUEUE_VERSION"
SHARE="$CACHE/share/kueue-$KUEUE_VERSION"
OUT="$BIN/kueue-$KUEUE_VERSION"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ "${1:-}" == "--print-srcdir" ]]; then echo "$SRC"; exit 0; fi
SOURCE_ONLY=0
[[ "${1:-}" == "--source-only" ]] && SOURCE_ONLY=1

log() { echo "[kueue-build $(date +%H:%M:%S)] $*"; }
PATCH_MARK="$SRC/.testbed-patch-v3"
if [[ -e "$SHARE/.complete" && -e "$PATCH_MARK" ]] && { ((SOURCE_ONLY)) || [[ -x "$OUT" ]]; }; then
    log "kueue $KUEUE_VERSION: cached"; exit 0
fi
command -v go >/dev/null || { echo "build-kueue.sh: go not found in PATH" >&2; exit 1; }

export GOCACHE="${MPILAUNCH_GOCACHE:-$ROOT_CACHE/mpilaunch-go/build}"
export GOMODCACHE="${MPILAUNCH_GOMODCACHE:-$ROOT_CACHE/mpilaunch-go/mod}"
export CGO_ENABLED=0 GOFLAGS="-mod=mod -modcacherw" GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
mkdir -p "$BIN" "$CACHE/src"

# ---- source: the module, copied writable, then patched (below). A source
# dir without the current patch marker is copied afresh from the module.
if [[ ! -e "$PATCH_MARK" ]]; then
    log "fetching sigs.k8s.io/kueue@$KUEUE_VERSION"
    mod_dir="$(cd /tmp && go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" \
        | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    [[ -d "$mod_dir" ]] || { echo "build-kueue.sh: no module dir for kueue@$KUEUE_VERSION" >&2; exit 1; }
    rm -rf "$SRC" "$SHARE" "$OUT"
    cp -r "$mod_dir" "$SRC.tmp.$$"
    chmod -R u+w "$SRC.tmp.$$"
    mv "$SRC.tmp.$$" "$SRC"
fi

# ---- testbed patch: with internalCertManagement off, Kueue reads the metrics
# server's cert from /etc/kueue/metrics/certs and the visibility server's from
# /visibility (fixed paths, mounted Secrets in a real deployment). Make both
# relative to $KUEUE_TESTBED_CERT_ROOT (unset: unchanged), so that a testbed
# run needs no root and several can run side by side. Nothing else changes.
if [[ ! -e "$PATCH_MARK" ]]; then
    main="$SRC/cmd/kueue/main.go"
    grep -q 'metricsCertPath := "/etc/kueue/metrics/certs"' "$main" \
        || { echo "build-kueue.sh: metrics cert path not found in $main" >&2; exit 1; }
    sed -i 's|metricsCertPath := "/etc/kueue/metrics/certs"|metricsCertPath := testbedCertRoot + "/etc/kueue/metrics/certs"|' "$main"
    cat >"$SRC/cmd/kueue/testbed_paths.go" <<'GO'
package main

import "os"

// testbedCertRoot prefixes the fixed metrics cert path (mpilaunch testbed patch).
var testbedCertRoot = os.Getenv("KUEUE_TESTBED_CERT_ROOT")
GO
    grep -q 'certDir = "/visibility"' "$SRC/pkg/visibility/server.go" \
        || { echo "build-kueue.sh: visibility certDir not found" >&2; exit 1; }
    cat >"$SRC/pkg/visibility/testbed_paths.go" <<'GO'
package visibility

import "os"

// mpilaunch testbed patch: the visibility server's cert dir under $KUEUE_TESTBED_CERT_ROOT.
func init() { certDir = os.Getenv("KUEUE_TESTBED_CERT_ROOT") + certDir }
GO
    # A kube-apiserver built from a source tarball without version ldflags
    # reports gitVersion "v0.0.0-master+$Format:%H$", which Kueue cannot parse
    # (it exits). Fall back to the reported major.minor then; a parseable
    # gitVersion is used as before.
    kv="$SRC/pkg/util/kubeversion/kubeversion.go"
    grep -q 'return versionutil.ParseSemantic(clusterVersionInfo.String())' "$kv" \
        || { echo "build-kueue.sh: server version parse not found in $kv" >&2; exit 1; }
    sed -i 's|return versionutil.ParseSemantic(clusterVersionInfo.String())|return testbedParseServerVersion(clusterVersionInfo)|' "$kv"
    cat >"$SRC/pkg/util/kubeversion/testbed_version.go" <<'GO'
package kubeversion

import (
	"strings"

	versionutil "k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apimachinery/pkg/version"
)

// testbedParseServerVersion: gitVersion, else major.minor (mpilaunch testbed patch).
func testbedParseServerVersion(info *version.Info) (*versionutil.Version, error) {
	v, err := versionutil.ParseSemantic(info.String())
	if err == nil || info.Major == "" || info.Minor == "" {
		return v, err
	}
	return versionutil.ParseSemantic(info.Major + "." + strings.TrimSuffix(info.Minor, "+") + ".0")
}
GO
    # No Kubeflow Trainer integration: its generated API code names a core/v1 type that client-go
    # 0.36 (kwok's, which Kueue is built with) no longer has, and the testbed enables only the pod
    # integration. The prebuilt-workload kind list keeps TrainJob's name as a string.
    jobs="$SRC/pkg/controller/jobs/jobs.go" validation="$SRC/pkg/controller/jobframework/validation.go"
    grep -q '_ "sigs.k8s.io/kueue/pkg/controller/jobs/trainjob"' "$jobs" \
        && grep -q 'kftrainer.SchemeGroupVersion.WithKind(kftrainer.TrainJobKind).String(),' "$validation" \
        || { echo "build-kueue.sh: the trainjob integration's imports not found" >&2; exit 1; }
    sed -i '/_ "sigs.k8s.io\/kueue\/pkg\/controller\/jobs\/trainjob"/d' "$jobs"
    sed -i -e '/kftrainer "github.com\/kubeflow\/trainer\/v2\/pkg\/apis\/trainer\/v1alpha1"/d' \
        -e 's|kftrainer.SchemeGroupVersion.WithKind(kftrainer.TrainJobKind).String(),|"trainer.kubeflow.org/v1alpha1, Kind=TrainJob",|' \
        "$validation"
    if grep -q kftrainer "$validation" "$jobs"; then
        echo "build-kueue.sh: the trainjob integration is still referenced" >&2; exit 1
    fi
    touch "$PATCH_MARK"
fi

# ---- manifests for kueue.py (no kustomize at start time)
if [[ ! -e "$SHARE/.complete" ]]; then
    rm -rf "$SHARE"
    mkdir -p "$SHARE/crds" "$SHARE/crd-patches" "$SHARE/webhook"
    cp "$SRC"/config/components/crd/bases/*.yaml "$SHARE/crds/"
    cp "$SRC"/config/components/crd/patches/webhook_in_*.yaml "$SHARE/crd-patches/"
    # which CRDs kustomize patches with the conversion webhook (commented-out lines are not)
    sed -n 's|^- path: patches/\(webhook_in_.*\.yaml\)$|\1|p' \
        "$SRC/config/components/crd/kustomization.yaml" >"$SHARE/crd-patches/enabled.txt"
    cp "$SRC/config/components/webhook/manifests.yaml" "$SRC/config/components/webhook/kustomization.yaml" \
        "$SHARE/webhook/"
    touch "$SHARE/.complete"
fi

# ---- the binary: build.sh's kwok graph (above)
if ((SOURCE_ONLY)); then
    log "kueue $KUEUE_VERSION source ready: $SRC, manifests in $SHARE"
    exit 0
fi
if [[ ! -x "$OUT" ]]; then
    "$HERE/build.sh" kueue
fi
log "kueue $KUEUE_VERSION ready: $OUT, manifests in $SHARE"
