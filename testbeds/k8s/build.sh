#!/usr/bin/env bash
# Build the binaries of a local Kubernetes test control plane and its real
# node from Go modules.
#
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kubelet
#       (no kube-proxy: the real node DNATs the one Service it needs itself, node.py)
#       from k8s.io/kubernetes (wrapper go.mod replacing every staging module
#       with its published v0.X.Y version)
#   etcd         go.etcd.io/etcd/server/v3 (cmd/etcd/main.go), a module
#                Kubernetes' own graph already holds at the same version
#   kube-router  the real node's NetworkPolicy enforcer (netpol.py)
#       all of them in ONE module graph and ONE `go build`: the packages they
#       share (client-go, the API types, gRPC, protobuf, the standard library
#       with these flags) compile once, and the links run in parallel. Built
#       alone, each compiled its own copy of client-go at its own version: on
#       this 2-core machine the Go builds are the setup's largest use of CPU.
#       (kube-router v2.1.0 asks for client-go 0.29; it builds and runs with
#       0.33, the graph's.)
#   coredns      the real node's DNS, only the plugins it uses (cmd/coredns/main.go),
#       in a graph of its own: v1.12.1 does not build with client-go 0.33
#       (cache.Config.RetryOnError), and v1.12.3, which does, needs gRPC 1.73
#       where Kubernetes 1.33 has 1.68
#   kwok, kueue  kwok from its published module source with a patch (below), and Kueue's
#       controller manager from the source build-kueue.sh --source-only patches: a
#       second graph, at client-go 0.36 (kwok's; Kubernetes 1.33 does not build with it),
#       in one go build, where the two share client-go, the apiserver library and
#       the API types (572 of kwok's 758 non-standard packages: built apart, each
#       compiled its own)
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
KUBE_ROUTER_VERSION="${KUBE_ROUTER_VERSION:-v2.1.0}"
COREDNS_VERSION="${COREDNS_VERSION:-v1.12.1}"
KUEUE_VERSION="${KUEUE_VERSION:-v0.17.0}"
KUBE_ROUTER_PKG=github.com/cloudnativelabs/kube-router/v2

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

K8S_CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet)
# what the one go build makes: Kubernetes' commands and the tools that join its graph
GRAPH_CMDS=("${K8S_CMDS[@]}" etcd kube-router)
# what the second go build makes (kwok's graph)
KWOK_GRAPH_CMDS=(kwok kueue)
ALL=("${GRAPH_CMDS[@]}" coredns "${KWOK_GRAPH_CMDS[@]}")
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
# what kube-router's Makefile passes, so its --version names the version
GRAPH_LDFLAGS="$LDFLAGS -X $KUBE_ROUTER_PKG/pkg/version.Version=$KUBE_ROUTER_VERSION -X $KUBE_ROUTER_PKG/pkg/version.BuildDate=mpilaunch"

mkdir -p "$BIN" "$SRC"

log() { echo "[k8s-build $(date +%H:%M:%S)] $*"; }

version_of() {
    case "$1" in
        etcd) echo "$ETCD_VERSION" ;;
        kwok) echo "$KWOK_VERSION-p$KWOK_PATCH_ID" ;;
        kube-router) echo "$KUBE_ROUTER_VERSION" ;;
        coredns) echo "$COREDNS_VERSION" ;;
        kueue) echo "$KUEUE_VERSION" ;;
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
        kwok|kueue) probe=(--help) ;;
        kubectl) probe=(version --client) ;;
        coredns) probe=(-version) ;;
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

# ------------------------------------------------ kubernetes and its graph's tools
GRAPH_DIR="$SRC/graph-$K8S_VERSION"
# the staging modules in kube-router's own go.mod (go list -m all)
TOOL_STAGING="k8s.io/api k8s.io/apimachinery k8s.io/client-go k8s.io/cri-api"
# write_graph_module: the wrapper module, written anew before each build (the
# versions above decide it; go build fills in go.sum).
write_graph_module() {
    local dir="$GRAPH_DIR" mod="$CACHE/tmp-gomod-graph-$K8S_VERSION.$$"
    mkdir -p "$dir/cmd"
    # the upstream go.mod lists every staging module in its replace block
    (cd "$dir" && GOFLAGS=-modcacherw go mod download -json "k8s.io/kubernetes@$K8S_VERSION" >/dev/null)
    local upstream staging m
    upstream="$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/$K8S_VERSION.mod"
    staging="$(sed -n '/^replace (/,/^)/p' "$upstream" | awk '$2=="=>" && $3 ~ /^\.\/staging\// {print $1}')"
    [[ -n "$staging" ]] || { echo "no staging modules found in $upstream" >&2; exit 1; }
    {
        echo "module mpilaunch.local/k8sgraph"
        echo
        echo "go 1.24.0"
        echo
        echo "require ("
        echo "	k8s.io/kubernetes $K8S_VERSION"
        echo "	go.etcd.io/etcd/server/v3 $ETCD_VERSION"
        echo "	$KUBE_ROUTER_PKG $KUBE_ROUTER_VERSION"
        # The staging modules the tools ask for at an older version, required at the published
        # one, not only replaced: then every package sees the same module version (-trimpath
        # names a package's files by module@version, and the build cache keys on that; a
        # replaced-only module is v0.0.0 to Kubernetes and v0.29.2 to kube-router, so its
        # packages compiled twice). Not all of them: some are not published at every version.
        for m in $TOOL_STAGING; do echo "	$m $STAGING_VERSION"; done
        echo ")"
        echo
        echo "replace ("
        for m in $staging; do echo "	$m => $m $STAGING_VERSION"; done
        echo ")"
    } >"$mod"
    mv "$mod" "$dir/go.mod"
    cp -r "$HERE/cmd/etcd" "$dir/cmd/"
}

# pkg_of NAME: the package the one go build makes NAME from (run in GRAPH_DIR)
pkg_of() {
    case "$1" in
        etcd) echo "./cmd/$1" ;;
        kube-router) echo "$KUBE_ROUTER_PKG/cmd/kube-router" ;;
        *) echo "k8s.io/kubernetes/cmd/$1" ;;
    esac
}

# to_build NAME...: the NAMEs wanted and missing or broken, one a line (the others are said cached)
to_build() {
    local c
    for c in "$@"; do
        wants "$c" || continue
        if need "$c" >&2; then echo "$c"; else log "$c $(version_of "$c"): cached" >&2; fi
    done
}

build_graph() {
    local todo=()
    mapfile -t todo < <(to_build "${GRAPH_CMDS[@]}")
    ((${#todo[@]})) || return 0
    write_graph_module
    local dir="$GRAPH_DIR" out="$GRAPH_DIR/out" pkgs=()
    for c in "${todo[@]}"; do pkgs+=("$(pkg_of "$c")"); done
    log "building ${todo[*]} in one go build (kubernetes $K8S_VERSION; minutes the first time)"
    local t0=$SECONDS
    rm -rf "$out" && mkdir -p "$out"
    (cd "$dir" && go build -trimpath -gcflags=all=-dwarf=false -ldflags="$GRAPH_LDFLAGS" -o "$out/" "${pkgs[@]}") || {
        log "building ${todo[*]} failed. If the errors say a k8s.io/<staging>@$STAGING_VERSION zip is" \
            "'not available' (403), the module proxy lacks that version: choose another" \
            "K8S_VERSION whose staging modules are all published."
        exit 1
    }
    for c in "${todo[@]}"; do install_bin "$c" "$out/$c"; done
    log "${todo[*]} built in $((SECONDS - t0))s"
}

# ------------------------------------------------------------------- coredns
build_coredns() {
    wants coredns || return 0
    need coredns || { log "coredns $COREDNS_VERSION: cached"; return 0; }
    local dir="$SRC/coredns-$COREDNS_VERSION" t0=$SECONDS
    mkdir -p "$dir"
    cp "$HERE/cmd/coredns/main.go" "$dir/main.go"
    printf 'module mpilaunch.local/corednswrapper\n\ngo 1.23.0\n\nrequire github.com/coredns/coredns %s\n' \
        "$COREDNS_VERSION" >"$dir/go.mod"
    log "building coredns $COREDNS_VERSION (bind, kubernetes, hosts, errors, log, health, ready)"
    (cd "$dir" && go mod tidy && go build -trimpath -gcflags=all=-dwarf=false -ldflags="$LDFLAGS" -o "$dir/coredns.out" .)
    install_bin coredns "$dir/coredns.out"
    log "coredns built in $((SECONDS - t0))s"
}

# ------------------------------------------------------------- kwok and kueue
# kwok is built from its published module source with a small patch
# (kwok-$KWOK_VERSION-exec.patch next to this script): upstream kwok loses the
# exit code of an exec'd command (the client always sees an internal error,
# exit 1) and never closes the command's stdin when the client's stdin ends.
# The binary name carries a hash of the patch, so changing it rebuilds.
# Kueue's source comes patched from build-kueue.sh --source-only (it also stages
# Kueue's manifests). The two build in one module, $SRC/kwok-graph-$KWOK_VERSION,
# whose go.mod requires both, each replaced by its patched copy.
kwok_source() {  # the patched kwok source dir, and kwok's stage definitions and CRDs
    local share="$CACHE/share/kwok-$KWOK_VERSION" src="$SRC/kwok-$(version_of kwok)" moddir=""
    if [[ ! -f "$share/.complete" || ! -f "$src/.patched" ]]; then
        moddir="$(cd "$SRC" && GOFLAGS=-modcacherw go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
        [[ -d "$moddir" ]] || { echo "could not download sigs.k8s.io/kwok@$KWOK_VERSION" >&2; exit 1; }
    fi
    if [[ ! -f "$share/.complete" ]]; then
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
    if [[ ! -f "$src/.patched" ]]; then
        rm -rf "$src"
        cp -r "$moddir" "$src"
        chmod -R u+w "$src"
        patch -s -p1 -d "$src" <"$KWOK_PATCH"
        touch "$src/.patched"
    fi
}

build_kwok_graph() {
    local c todo=()
    mapfile -t todo < <(to_build "${KWOK_GRAPH_CMDS[@]}")
    # kwok's data files come with kwok even when its binary is cached; the graph needs its source
    if wants kwok || ((${#todo[@]})); then kwok_source; fi
    ((${#todo[@]})) || return 0
    KUEUE_VERSION="$KUEUE_VERSION" "$HERE/build-kueue.sh" --source-only
    local kueue_src dir="$SRC/kwok-graph-$KWOK_VERSION" t0=$SECONDS pkgs=()
    kueue_src="$(KUEUE_VERSION="$KUEUE_VERSION" "$HERE/build-kueue.sh" --print-srcdir)"
    mkdir -p "$dir"
    # go 1.26: kwok's go.mod asks for it (Kueue's, 1.25). The gRPC middleware's Prometheus
    # provider: a package that no go.mod of the graph names a module for, which go build would
    # otherwise look up as "latest" (v1.1.1 on 2026-11-28).
    printf '%s\n' "module mpilaunch.local/kwokgraph" "" "go 1.26.0" "" "require (" \
        "	sigs.k8s.io/kwok $KWOK_VERSION" "	sigs.k8s.io/kueue $KUEUE_VERSION" \
        "	github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus v1.1.1" ")" "" "replace (" \
        "	sigs.k8s.io/kwok => $SRC/kwok-$(version_of kwok)" "	sigs.k8s.io/kueue => $kueue_src" ")" >"$dir/go.mod"
    for c in "${todo[@]}"; do pkgs+=("sigs.k8s.io/$c/cmd/$c"); done
    log "building ${todo[*]} in one go build (kwok $KWOK_VERSION, patched: $(basename "$KWOK_PATCH"); kueue $KUEUE_VERSION)"
    # what Kueue's Makefile passes, so its version is known
    local commit vpkg=sigs.k8s.io/kueue/pkg/version
    commit="$(sed -n 's/.*"Hash": *"\([0-9a-f]*\)".*/\1/p' "$GOMODCACHE/cache/download/sigs.k8s.io/kueue/@v/$KUEUE_VERSION.info" 2>/dev/null || true)"
    rm -rf "$dir/out" && mkdir -p "$dir/out"
    (cd "$dir" && go build -trimpath -gcflags=all=-dwarf=false \
        -ldflags="$LDFLAGS -X $vpkg.GitVersion=$KUEUE_VERSION -X $vpkg.GitCommit=${commit:-unknown}" \
        -o "$dir/out/" "${pkgs[@]}")
    if [[ -f "$dir/out/kueue" ]]; then
        # Kueue knows its flags (Go's flag package prints "-config")
        grep -q -- '-visibility-server-port' <<<"$("$dir/out/kueue" --help 2>&1 || true)" \
            || { echo "build.sh: kueue's smoke check failed ($dir/out/kueue --help)" >&2; exit 1; }
    fi
    for c in "${todo[@]}"; do install_bin "$c" "$dir/out/$c"; done
    log "${todo[*]} built in $((SECONDS - t0))s"
}

T0=$SECONDS
log "cache: $CACHE; kubernetes $K8S_VERSION, etcd $ETCD_VERSION, kube-router $KUBE_ROUTER_VERSION, coredns $COREDNS_VERSION, kwok $KWOK_VERSION, kueue $KUEUE_VERSION; $(go version)"
# kwok's graph and CoreDNS's are module graphs of their own: their downloads and compiles
# overlap the big build (on 2 cores that hides the module downloads).
{ build_kwok_graph && build_coredns; } > >(sed 's/^/[kwok, kueue, coredns] /') 2>&1 &
small_pid=$!
graph_rc=0; build_graph || graph_rc=$?
small_rc=0; wait "$small_pid" || small_rc=$?
if ((graph_rc || small_rc)); then
    log "FAILED (the one go build rc=$graph_rc, kwok, kueue and coredns rc=$small_rc)"
    exit 1
fi
log "done in $((SECONDS - T0))s; binaries in $BIN"
