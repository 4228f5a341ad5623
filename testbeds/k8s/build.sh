#!/usr/bin/env bash
# Build the binaries of a local Kubernetes test control plane from Go modules.
#
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kubelet,
#   kube-proxy
#       from k8s.io/kubernetes (wrapper go.mod replacing every staging module
#       with its published v0.X.Y version), all in ONE `go build` so the
#       shared packages compile once and the links run in parallel
#   etcd  from go.etcd.io/etcd/server/v3/etcdmain (tiny wrapper main)
#   kwok  via `go install sigs.k8s.io/kwok/cmd/kwok@VERSION`
#
# Output: $MPILAUNCH_K8S_CACHE/bin/<name>-<version>  (default cache:
# $MPILAUNCH_CACHE/mpilaunch-k8s, MPILAUNCH_CACHE defaulting to ~/.cache).
# The Go build and module caches live under $MPILAUNCH_CACHE/mpilaunch-go, so
# a fresh MPILAUNCH_CACHE really builds from nothing.
# Idempotent: a binary already there is smoke-checked (`--version`) and
# rebuilt only when missing or broken.
#
# Usage: build.sh [--print-bindir] [component...]
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.33.13}"
ETCD_VERSION="${ETCD_VERSION:-v3.5.21}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
KWOK_PATCH="$HERE/kwok-$KWOK_VERSION-exec.patch"
KWOK_PATCH_ID="$(sha256sum "$KWOK_PATCH" | cut -c1-8)"

ROOT_CACHE="${MPILAUNCH_CACHE:-$HOME/.cache}"
CACHE="${MPILAUNCH_K8S_CACHE:-$ROOT_CACHE/mpilaunch-k8s}"
export GOCACHE="${MPILAUNCH_GOCACHE:-$ROOT_CACHE/mpilaunch-go/build}"
export GOMODCACHE="${MPILAUNCH_GOMODCACHE:-$ROOT_CACHE/mpilaunch-go/mod}"
BIN="$CACHE/bin"
SRC="$CACHE/src"

if [[ "${1:-}" == "--print-bindir" ]]; then
    echo "$BIN"
    exit 0
fi

# staging version: v1.33.13 -> v0.33.13
STAGING_VERSION="v0.${K8S_VERSION#v1.}"

K8S_CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)
ALL=("${K8S_CMDS[@]}" etcd kwok)
WANT=("$@")
if [[ ${#WANT[@]} -eq 0 ]]; then WANT=("${ALL[@]}"); fi

command -v go >/dev/null || { echo "build.sh: go not found in PATH" >&2; exit 1; }

export CGO_ENABLED=0
# -modcacherw: a throw-away MPILAUNCH_CACHE can be removed with plain rm -rf
export GOFLAGS="-mod=mod -modcacherw"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
# -s -w: no symbol table or DWARF in the binaries. -gcflags=all=-dwarf=false (every
# go build of the testbed scripts) keeps the compiler from generating the DWARF the
# linker then drops: the same binary, ~10% less compile time (etcd from an empty
# GOCACHE: 37.8 -> 34.1 s here).
LDFLAGS="-s -w"

mkdir -p "$BIN" "$SRC"

log() { echo "[k8s-build $(date +%H:%M:%S)] $*"; }

version_of() {
    case "$1" in
        etcd) echo "$ETCD_VERSION" ;;
        kwok) echo "$KWOK_VERSION-p$KWOK_PATCH_ID" ;;
        *) echo "$K8S_VERSION" ;;
    esac
}

wants() {
    local x
    for x in "${WANT[@]}"; do [[ "$x" == "$1" ]] && return 0; done
    return 1
}

need() {  # need NAME -> true if the binary is missing or fails its smoke check
    local bin="$BIN/$1-$(version_of "$1")"
    [[ -x "$bin" ]] || return 0
    local probe=(--version)
    case "$1" in
        kwok) probe=(--help) ;;
        kubectl) probe=(version --client) ;;
    esac
    if ! "$bin" "${probe[@]}" >/dev/null 2>&1; then
        log "$bin fails its smoke check (${probe[*]}): rebuilding"
        rm -f "$bin"
        return 0
    fi
    return 1
}

install_bin() {  # install_bin NAME BUILT_FILE
    local dst="$BIN/$1-$(version_of "$1")"
    mv -f "$2" "$dst.tmp.$$"
    mv -f "$dst.tmp.$$" "$dst"
    ln -sfn "$1-$(version_of "$1")" "$BIN/$1"
    log "installed $dst"
}

# ---------------------------------------------------------------- kubernetes
K8S_DIR=""
k8s_wrapper() {  # sets K8S_DIR
    local dir="$SRC/kubernetes-$K8S_VERSION"
    K8S_DIR="$dir"
    local mod="$CACHE/tmp-gomod-kubernetes-$K8S_VERSION"
    mkdir -p "$dir"
    if [[ ! -f "$dir/go.mod" ]]; then
        log "writing wrapper go.mod for k8s.io/kubernetes $K8S_VERSION (staging $STAGING_VERSION)"
        # the upstream go.mod lists every staging module in its replace block
        (cd "$dir" && GOFLAGS=-modcacherw go mod download -json "k8s.io/kubernetes@$K8S_VERSION" >/dev/null)
        local upstream
        upstream="$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/$K8S_VERSION.mod"
        local staging
        staging="$(sed -n '/^replace (/,/^)/p' "$upstream" | awk '$2=="=>" && $3 ~ /^\.\/staging\// {print $1}')"
        [[ -n "$staging" ]] || { echo "no staging modules found in $upstream" >&2; exit 1; }
        {
            echo "module mpilaunch.local/k8swrapper"
            echo
            echo "go 1.23.0"
            echo
            echo "require k8s.io/kubernetes $K8S_VERSION"
            echo
            echo "replace ("
            for m in $staging; do echo "	$m => $m $STAGING_VERSION"; done
            echo ")"
        } >"$mod"
        mv "$mod" "$dir/go.mod"
    fi
}

build_k8s() {
    local c todo=()
    for c in "${K8S_CMDS[@]}"; do
        wants "$c" || continue
        if need "$c"; then todo+=("$c"); else log "$c $K8S_VERSION: cached"; fi
    done
    ((${#todo[@]})) || return 0
    k8s_wrapper
    local dir="$K8S_DIR" out="$K8S_DIR/out" pkgs=()
    for c in "${todo[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
    log "building ${todo[*]} $K8S_VERSION in one go build (minutes the first time)"
    local t0=$SECONDS
    rm -rf "$out" && mkdir -p "$out"
    (cd "$dir" && go build -trimpath -gcflags=all=-dwarf=false -ldflags="$LDFLAGS" -o "$out/" "${pkgs[@]}") || {
        log "building ${todo[*]} failed. If the errors say a k8s.io/<staging>@$STAGING_VERSION zip is" \
            "'not available' (403), the module proxy lacks that version: choose another" \
            "K8S_VERSION whose staging modules are all published."
        exit 1
    }
    for c in "${todo[@]}"; do install_bin "$c" "$out/$c"; done
    log "${todo[*]} built in $((SECONDS - t0))s"
}

# ---------------------------------------------------------------------- etcd
build_etcd() {
    wants etcd || return 0
    need etcd || { log "etcd $ETCD_VERSION: cached"; return 0; }
    local dir="$SRC/etcd-$ETCD_VERSION"
    mkdir -p "$dir"
    if [[ ! -f "$dir/go.mod" ]]; then
        cat >"$dir/main.go" <<'EOF'
// Command etcd: a wrapper around the etcd server's main package.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
        printf 'module mpilaunch.local/etcdwrapper\n\ngo 1.23.0\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" >"$dir/go.mod.tmp"
        mv "$dir/go.mod.tmp" "$dir/go.mod"
    fi
    log "building etcd $ETCD_VERSION"
    local t0=$SECONDS
    (cd "$dir" && go mod tidy >/dev/null 2>&1 || true; go build -trimpath -gcflags=all=-dwarf=false -ldflags="$LDFLAGS" -o "$dir/etcd.out" .)
    install_bin etcd "$dir/etcd.out"
    log "etcd built in $((SECONDS - t0))s"
}

# ---------------------------------------------------------------------- kwok
# kwok is built from its published module source with a small patch
# (kwok-$KWOK_VERSION-exec.patch next to this script): upstream kwok loses the
# exit code of an exec'd command (the client always sees an internal error,
# exit 1) and never closes the command's stdin when the client's stdin ends.
# The binary name carries a hash of the patch, so changing it rebuilds.
build_kwok() {
    wants kwok || return 0
    local share="$CACHE/share/kwok-$KWOK_VERSION"
    local moddir=""
    if need kwok || [[ ! -f "$share/.complete" ]]; then
        moddir="$(cd "$SRC" && GOFLAGS=-modcacherw go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
        [[ -d "$moddir" ]] || { echo "could not download sigs.k8s.io/kwok@$KWOK_VERSION" >&2; exit 1; }
        # stage definitions and CRDs that kwokctl would write/apply
        rm -rf "$share.tmp" && mkdir -p "$share.tmp/stages" "$share.tmp/crds"
        cp "$moddir"/kustomize/stage/node/fast/node-initialize.yaml \
           "$moddir"/kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
           "$moddir"/kustomize/stage/pod/fast/pod-ready.yaml \
           "$moddir"/kustomize/stage/pod/fast/pod-complete.yaml \
           "$moddir"/kustomize/stage/pod/fast/pod-delete.yaml "$share.tmp/stages/"
        cp "$moddir"/kustomize/crd/bases/*.yaml "$share.tmp/crds/"
        touch "$share.tmp/.complete"
        rm -rf "$share" && mv "$share.tmp" "$share"
        chmod -R u+w "$share"
    fi
    need kwok || { log "kwok $(version_of kwok): cached"; return 0; }
    log "building kwok $KWOK_VERSION (patched: $(basename "$KWOK_PATCH"))"
    local t0=$SECONDS
    local src="$SRC/kwok-$(version_of kwok)"
    if [[ ! -f "$src/.patched" ]]; then
        rm -rf "$src"
        cp -r "$moddir" "$src"
        chmod -R u+w "$src"
        patch -s -p1 -d "$src" <"$KWOK_PATCH"
        touch "$src/.patched"
    fi
    (cd "$src" && go build -trimpath -gcflags=all=-dwarf=false -ldflags="$LDFLAGS" -o "$src/kwok.out" ./cmd/kwok)
    install_bin kwok "$src/kwok.out"
    log "kwok built in $((SECONDS - t0))s"
}

T0=$SECONDS
log "cache: $CACHE; kubernetes $K8S_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION; $(go version)"
# etcd and kwok are separate modules: their downloads and compiles overlap the
# big Kubernetes build (on 2 cores that hides the module downloads).
build_etcd > >(sed 's/^/[etcd] /') 2>&1 &
etcd_pid=$!
build_kwok > >(sed 's/^/[kwok] /') 2>&1 &
kwok_pid=$!
k8s_rc=0; build_k8s || k8s_rc=$?
etcd_rc=0; wait "$etcd_pid" || etcd_rc=$?
kwok_rc=0; wait "$kwok_pid" || kwok_rc=$?
if ((k8s_rc || etcd_rc || kwok_rc)); then
    log "FAILED (kubernetes rc=$k8s_rc, etcd rc=$etcd_rc, kwok rc=$kwok_rc)"
    exit 1
fi
log "done in $((SECONDS - T0))s; binaries in $BIN"
