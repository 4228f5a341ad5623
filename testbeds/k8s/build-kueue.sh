#!/usr/bin/env bash
# Build Kueue's controller manager (cmd/kueue) for the Kubernetes testbed.
#
# The source is the Go module sigs.k8s.io/kueue@$KUEUE_VERSION (fetched through
# the module proxy into the shared GOMODCACHE), copied writable to
# $CACHE/src/kueue-$KUEUE_VERSION and built there with its own go.mod/go.sum,
# after a small testbed patch (two fixed cert paths made relocatable, and a
# fallback for an unparseable server gitVersion; see below).
# The CRDs, their conversion-webhook patches and the admission-webhook
# configurations are copied to $CACHE/share/kueue-$KUEUE_VERSION, so that
# kueue.py starts Kueue without any network.
# The Go caches are shared with build.sh ($MPILAUNCH_CACHE/mpilaunch-go).
#
# Output: $MPILAUNCH_K8S_CACHE/bin/kueue-<version> (+ symlink kueue),
#         $MPILAUNCH_K8S_CACHE/share/kueue-<version>/{crds,crd-patches,webhook}/
# Idempotent: a binary and manifests already there are not rebuilt.
set -euo pipefail

KUEUE_VERSION="${KUEUE_VERSION:-v0.17.0}"
ROOT_CACHE="${MPILAUNCH_CACHE:-$HOME/.cache}"
CACHE="${MPILAUNCH_K8S_CACHE:-$ROOT_CACHE/mpilaunch-k8s}"
BIN="$CACHE/bin"
SRC="$CACHE/src/kueue-$KUEUE_VERSION"
SHARE="$CACHE/share/kueue-$KUEUE_VERSION"
OUT="$BIN/kueue-$KUEUE_VERSION"

log() { echo "[kueue-build $(date +%H:%M:%S)] $*"; }
if [[ -x "$OUT" && -e "$SHARE/.complete" && -e "$SRC/.testbed-patch-v2" ]]; then log "kueue $KUEUE_VERSION: cached"; exit 0; fi
command -v go >/dev/null || { echo "build-kueue.sh: go not found in PATH" >&2; exit 1; }

export GOCACHE="${MPILAUNCH_GOCACHE:-$ROOT_CACHE/mpilaunch-go/build}"
export GOMODCACHE="${MPILAUNCH_GOMODCACHE:-$ROOT_CACHE/mpilaunch-go/mod}"
export CGO_ENABLED=0 GOFLAGS="-mod=mod -modcacherw" GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
mkdir -p "$BIN" "$CACHE/src"

# ---- source: the module, copied writable, then patched (below). A source
# dir without the current patch marker is copied afresh from the module.
PATCH_MARK="$SRC/.testbed-patch-v2"
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

# ---- the binary
if [[ ! -x "$OUT" ]]; then
    log "building kueue $KUEUE_VERSION (cmd/kueue)"
    t0=$SECONDS
    commit="$(sed -n 's/.*"Hash": *"\([0-9a-f]*\)".*/\1/p' "$GOMODCACHE/cache/download/sigs.k8s.io/kueue/@v/$KUEUE_VERSION.info" 2>/dev/null || true)"
    vpkg=sigs.k8s.io/kueue/pkg/version
    (cd "$SRC" && go build -trimpath -gcflags=all=-dwarf=false \
        -ldflags="-s -w -X $vpkg.GitVersion=$KUEUE_VERSION -X $vpkg.GitCommit=${commit:-unknown}" \
        -o "$SRC/kueue.out" ./cmd/kueue)
    # smoke check: the binary runs and knows its flags (Go's flag package prints "-config")
    help="$("$SRC/kueue.out" --help 2>&1 || true)"
    grep -q -- '-config' <<<"$help" && grep -q -- '-visibility-server-port' <<<"$help" \
        || { echo "build-kueue.sh: smoke check failed ($SRC/kueue.out --help)" >&2; exit 1; }
    mv -f "$SRC/kueue.out" "$OUT.tmp.$$" && mv -f "$OUT.tmp.$$" "$OUT"
    ln -sfn "kueue-$KUEUE_VERSION" "$BIN/kueue"
    log "installed $OUT in $((SECONDS - t0))s"
fi
log "kueue $KUEUE_VERSION ready: $OUT, manifests in $SHARE"
