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
#   images/mpilaunch-tf.tar      the same with TensorFlow (--with-tf), for PS mode
#   images/foreign-*.tar         images without mpilaunch, from Debian packages only
#                                (build-foreign-images.sh)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
source "$REPO/scripts/lib.sh"
CACHE="${MPILAUNCH_K8S_CACHE:-$MPILAUNCH_CACHE/mpilaunch-k8s}"
export MPILAUNCH_BUILDAH_ROOT="${MPILAUNCH_BUILDAH_ROOT:-$CACHE/buildah}"
T0=$SECONDS

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

# the image, and its TensorFlow variant for the PS-mode test (its own cached
# layer: ~2 min from PyPI the first time, nothing after a code change but
# the code layer)
for variant in "" --with-tf; do
  name=mpilaunch${variant:+-tf}
  tag="$("$REPO/scripts/build-image.sh" --local-base $variant --print-tag)"
  if [[ "$(cat "$CACHE/images/$name.tag" 2>/dev/null)" != "$tag" || ! -f "$CACHE/images/$name.tar" ]]; then
    t1=$SECONDS
    "$REPO/scripts/build-image.sh" --local-base $variant --archive "$CACHE/images/$name.tar" >/dev/null
    echo "$tag" >"$CACHE/images/$name.tag"
    log "image $tag ready in $((SECONDS - t1))s"
  fi
done
"$HERE/build-foreign-images.sh"
log "real node prerequisites ready in $((SECONDS - T0))s"
