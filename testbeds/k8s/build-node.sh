#!/usr/bin/env bash
# Everything the testbed's real node needs besides kubelet (build.sh builds
# that with the other Kubernetes binaries). Idempotent; cached under
# $MPILAUNCH_K8S_CACHE (default $MPILAUNCH_CACHE/mpilaunch-k8s):
#
#   apt: containerd, runc, containernetworking-plugins, iptables, ipset, buildah, mmdebstrap
#   bin/coredns-<version>        build.sh coredns, in Kubernetes' module graph
#   bin/kube-router-<version>    build.sh kube-router, likewise: the node's NetworkPolicy
#                                enforcer (netpol.py), which starts with the kubelet.
#                                MPILAUNCH_NODE_GO_BUILT=1 (scripts/test) leaves both to
#                                the caller's build.sh, so the graph is not compiled twice
#                                at once
#   images/pause.tar             the pod sandbox image, from pause/main.go
#   buildah/                     buildah's storage: the Debian base built with
#                                mmdebstrap and the project image's layers
#   images/mpilaunch.tar         the project's image (docker/Dockerfile) for the
#                                current sources; the tests rebuild it when the
#                                sources change (only the small code layer)
#   images/mpilaunch-horovod.tar the same with TensorFlow, PyTorch and Horovod
#                                (build-image.sh --with-horovod), for PS mode and the
#                                Horovod tests: one image for both. Only with
#                                --horovod-image, which builds nothing else: it needs
#                                scripts/build-horovod.sh's wheel (scripts/test's
#                                horovod-image phase runs it once that is built).
#                                Without it, the layers below the wheel's are built
#                                (--layers-only), so that one adds only two layers
#   images/foreign-*.tar         images without mpilaunch, from Debian packages only
#                                (build-foreign-images.sh)
#
#   testbeds/k8s/build-node.sh [--horovod-image]
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
source "$REPO/scripts/lib.sh"
CACHE="${MPILAUNCH_K8S_CACHE:-$MPILAUNCH_CACHE/mpilaunch-k8s}"
export MPILAUNCH_BUILDAH_ROOT="${MPILAUNCH_BUILDAH_ROOT:-$CACHE/buildah}"
T0=$SECONDS

# project_image [VARIANT]: the project's image (VARIANT: --with-horovod) as an archive for
# the node, rebuilt when the sources changed (only the code layer after a code change)
project_image() {
  local variant="${1:-}" name tag t1
  name=mpilaunch${variant:+-horovod}
  tag="$("$REPO/scripts/build-image.sh" --local-base $variant --print-tag 2>/dev/null || true)"
  if [[ -z "$tag" || "$(cat "$CACHE/images/$name.tag" 2>/dev/null)" != "$tag" || ! -f "$CACHE/images/$name.tar" ]]; then
    t1=$SECONDS
    tag="$("$REPO/scripts/build-image.sh" --local-base $variant --archive "$CACHE/images/$name.tar" | tail -1)"
    echo "$tag" >"$CACHE/images/$name.tag"
    log "image $tag ready in $((SECONDS - t1))s ($(du -m "$CACHE/images/$name.tar" | cut -f1) MB)"
  fi
}

if [[ "${1:-}" == --horovod-image ]]; then
  # Debian's torch, the `ps` extra's TensorFlow (both cached by the run without this flag), the
  # wheel and the code, each a layer: after a code change only the code layer
  apt_ensure buildah mmdebstrap
  mkdir -p "$CACHE/images"
  project_image --with-horovod
  rm -f "$CACHE"/images/mpilaunch-tf.{tar,tag}  # the TensorFlow-only variant this one replaced
  log "the Horovod image ready in $((SECONDS - T0))s"
  exit 0
fi
[[ $# == 0 ]] || { echo "build-node.sh: error: unknown argument $1 (--horovod-image or none)" >&2; exit 2; }

apt_ensure containerd runc containernetworking-plugins iptables ipset buildah mmdebstrap
[ "${MPILAUNCH_NODE_GO_BUILT:-0}" = 1 ] || "$HERE/build.sh" coredns kube-router

b=(buildah --root "$MPILAUNCH_BUILDAH_ROOT/storage" --runroot "$MPILAUNCH_BUILDAH_ROOT/run" --storage-driver overlay)
mkdir -p "$CACHE/images"
if [[ ! -f "$CACHE/images/pause.tar" ]]; then
  log "building the pause image"
  out="$(mktemp -d)"
  (cd "$HERE/pause" && CGO_ENABLED=0 GOTOOLCHAIN="${GOTOOLCHAIN:-local}" \
     GOCACHE="${MPILAUNCH_GOCACHE:-$MPILAUNCH_CACHE/mpilaunch-go/build}" \
     go build -trimpath -gcflags=all=-dwarf=false -ldflags="-s -w" -o "$out/pause" .)
  ctr="$("${b[@]}" from scratch)"
  "${b[@]}" copy "$ctr" "$out/pause" /pause >/dev/null
  "${b[@]}" config --entrypoint '["/pause"]' --cmd '' "$ctr"
  "${b[@]}" commit --quiet --rm "$ctr" mpilaunch.local/pause:1 >/dev/null
  "${b[@]}" push --quiet mpilaunch.local/pause:1 "docker-archive:$CACHE/images/pause.tar.tmp:mpilaunch.local/pause:1"
  mv -f "$CACHE/images/pause.tar.tmp" "$CACHE/images/pause.tar"
  rm -rf "$out"
fi

project_image
# the Horovod variant's layers below the wheel (Debian's torch, the `ps` extra's TensorFlow: ~5 min
# from the mirrors the first time), built now, beside Horovod's compile, so that --horovod-image
# adds only the wheel's layer and the code's
t1=$SECONDS
"$REPO/scripts/build-image.sh" --local-base --with-horovod --layers-only >/dev/null
log "the Horovod image's torch and TensorFlow layers ready in $((SECONDS - t1))s"
"$HERE/build-foreign-images.sh"
log "real node prerequisites ready in $((SECONDS - T0))s"
