#!/usr/bin/env bash
# Build the mpilaunch worker/launcher image from docker/Dockerfile with
# buildah (no Docker daemon needed), and push it or write an archive.
#
#   scripts/build-image.sh --tag registry.example.com/ml/mpilaunch:0.1 \
#       --push docker://registry.example.com/ml/mpilaunch:0.1
#   scripts/build-image.sh --local-base --archive /tmp/mpilaunch.tar   # no registry at all
#
# Options:
#   --tag REF        image name (default mpilaunch.local/mpilaunch:<hash of what the image is built from>)
#   --base IMAGE     the Dockerfile's BASE (default: the Dockerfile's, debian:bookworm-slim)
#   --local-base     build the Debian base here with mmdebstrap from Debian's mirror
#                    (cached; for machines that cannot pull from a container registry)
#   --push DEST      buildah push to DEST: docker://HOST/NAME:TAG (log in first with
#                    `buildah login HOST`), oci-archive:FILE, docker-archive:FILE, ...
#   --archive FILE   write a docker-archive FILE (`ctr -n k8s.io images import FILE`,
#                    `docker load -i FILE`, `kind load image-archive FILE` read it)
#   --with-tf        add TensorFlow for PS mode: the `ps` extra of pyproject.toml, in a
#                    cached layer of its own (default tag mpilaunch.local/mpilaunch-tf:<hash>)
#   --print-tag      print the default tag for the current sources and exit
#   --print-ps-requirements  print the `ps` extra (the Dockerfile's PS_REQUIREMENTS) and exit
#
# Storage: buildah's default (/var/lib/containers), or $MPILAUNCH_BUILDAH_ROOT.
# Layers are cached (--layers): after a code change only the mpilaunch layer
# is rebuilt. The tag's hash covers docker/Dockerfile, pyproject.toml,
# README.md, mpilaunch/, tests/programs/, examples/, the base and the
# TensorFlow requirements.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

tag="" base="" local_base=0 push="" archive="" print_tag=0 with_tf=0
# The `ps` extra of pyproject.toml, space-separated (its pins live there only).
ps_requirements() {
  python3 -c 'import sys, tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["ps"]))'
}

while (($#)); do
  case "$1" in
    --tag) tag="$2"; shift 2 ;;
    --base) base="$2"; shift 2 ;;
    --local-base) local_base=1; shift ;;
    --push) push="$2"; shift 2 ;;
    --archive) archive="$2"; shift 2 ;;
    --with-tf) with_tf=1; shift ;;
    --print-tag) print_tag=1; shift ;;
    --print-ps-requirements) ps_requirements; exit 0 ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "build-image.sh: error: unknown option $1" >&2; echo "hint: see --help" >&2; exit 2 ;;
  esac
done

BASE_REF="mpilaunch.local/debian:bookworm"
if ((local_base)); then base="$BASE_REF"; fi
tf_reqs="" name="mpilaunch"
if ((with_tf)); then tf_reqs="$(ps_requirements)"; name="mpilaunch-tf"; fi

source_hash() {
  { printf 'base=%s\n' "$base"
    [[ -z "$tf_reqs" ]] || printf 'ps=%s\n' "$tf_reqs"
    find docker/Dockerfile pyproject.toml README.md mpilaunch tests/programs examples -type f \
      ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
  } | sha256sum | cut -c1-12
}
[[ -n "$tag" ]] || tag="mpilaunch.local/$name:$(source_hash)"
if ((print_tag)); then echo "$tag"; exit 0; fi

apt_ensure buildah
b=(buildah)
if [[ -n "${MPILAUNCH_BUILDAH_ROOT:-}" ]]; then
  b+=(--root "$MPILAUNCH_BUILDAH_ROOT/storage" --runroot "$MPILAUNCH_BUILDAH_ROOT/run" --storage-driver overlay)
fi

if ((local_base)) && ! "${b[@]}" inspect --type image "$BASE_REF" >/dev/null 2>&1; then
  apt_ensure mmdebstrap
  t0=$SECONDS
  rootfs="$(mktemp -d)/debian-bookworm.tar"
  log "mmdebstrap: Debian bookworm minbase -> $BASE_REF"
  mmdebstrap --quiet --variant=minbase --include=ca-certificates bookworm "$rootfs" http://deb.debian.org/debian
  ctr="$("${b[@]}" from scratch)"
  "${b[@]}" add "$ctr" "$rootfs" / >/dev/null
  "${b[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd /bin/bash "$ctr"
  "${b[@]}" commit --quiet --rm "$ctr" "$BASE_REF" >/dev/null
  rm -rf "$(dirname "$rootfs")"
  log "base image $BASE_REF built in $((SECONDS - t0))s"
fi

t0=$SECONDS
args=(bud --layers --isolation chroot --network host -f docker/Dockerfile -t "$tag")
[[ -n "$base" ]] && args+=(--build-arg "BASE=$base")
[[ -n "$tf_reqs" ]] && args+=(--build-arg "PS_REQUIREMENTS=$tf_reqs")
# pip inside the build trusts the host's CA bundle when the host names one
# (machines whose HTTPS goes through an intercepting proxy)
host_ca="${PIP_CERT:-${SSL_CERT_FILE:-}}"
if [[ -n "$host_ca" && -f "$host_ca" ]]; then
  args+=(--volume "$host_ca:/run/host-ca.crt:ro" --build-arg HOST_CA=/run/host-ca.crt)
fi
log "buildah ${args[*]} ."
"${b[@]}" "${args[@]}" . >&2
log "image $tag built in $((SECONDS - t0))s"
if [[ -n "$archive" ]]; then
  rm -f "$archive.tmp"
  "${b[@]}" push --quiet "$tag" "docker-archive:$archive.tmp:$tag" >&2
  mv -f "$archive.tmp" "$archive"
  log "wrote $archive"
fi
if [[ -n "$push" ]]; then
  "${b[@]}" push "$tag" "$push" >&2
  log "pushed $tag to $push"
fi
echo "$tag"
