#!/usr/bin/env bash
# Build the mpilaunch worker/launcher image from docker/Dockerfile with
# buildah (no Docker daemon needed), and push it or write an archive.
#
#   scripts/build-image.sh --tag registry.example.com/ml/mpilaunch:0.1 \
#       --push docker://registry.example.com/ml/mpilaunch:0.1
#   scripts/build-image.sh --local-base --archive /tmp/mpilaunch.tar   # no registry at all
#   scripts/build-image.sh --with-horovod --tag REG/mpilaunch-horovod:0.1 --push docker://REG/mpilaunch-horovod:0.1
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
#   --with-horovod   --with-tf plus PyTorch (Debian's python3-torch) and Horovod (TensorFlow
#                    and PyTorch, MPI and Gloo; CPU), each in a cached layer of its own
#                    (default tag mpilaunch.local/mpilaunch-horovod:<hash>). The wheel is
#                    the one scripts/build-horovod.sh builds (run here with
#                    MPILAUNCH_HOROVOD_FLAVOURS=openmpi: cached, else a compile of 20-40
#                    min) against this machine's Debian bookworm python3, torch and Open
#                    MPI 4.1, the image's own; a build host of another release needs
#                    --horovod-wheel
#   --horovod-wheel FILE  with --with-horovod: install this Horovod wheel instead (built for
#                    the image's Python 3.11, torch 1.13, Open MPI 4.1 and the pinned TensorFlow)
#   --layers-only    with --with-horovod: build only what needs no wheel (the torch and
#                    TensorFlow layers) into buildah's layer cache, tagged
#                    mpilaunch.local/mpilaunch-horovod-layers:<hash> to keep them; the
#                    testbed does this while Horovod compiles
#   --build-arg NAME=VALUE  one more build argument of docker/Dockerfile (repeatable; the
#                    GPU recipe of docker/README.md, untested)
#   --print-tag      print the default tag for the current sources and exit (--with-horovod:
#                    of the wheel built last; an error when there is none)
#   --print-ps-requirements  print the `ps` extra (the Dockerfile's PS_REQUIREMENTS) and exit
#
# Storage: buildah's default (/var/lib/containers), or $MPILAUNCH_BUILDAH_ROOT.
# Layers are cached (--layers): after a code change only the mpilaunch layer
# is rebuilt. The tag's hash covers docker/Dockerfile, pyproject.toml,
# README.md, mpilaunch/, tests/programs/, examples/, the base, the
# TensorFlow requirements, the Horovod wheel's sha256 and the --build-arg values.
# The last line on stdout is the tag built.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

tag="" base="" local_base=0 push="" archive="" print_tag=0 with_tf=0 with_horovod=0 horovod_wheel="" layers_only=0
extra_args=()
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
    --with-horovod) with_horovod=1 with_tf=1; shift ;;
    --horovod-wheel) horovod_wheel="$2"; shift 2 ;;
    --layers-only) layers_only=1; shift ;;
    --build-arg)
      [[ "$2" == ?*=* ]] || { echo "build-image.sh: error: --build-arg takes NAME=VALUE, not $2" >&2; exit 2; }
      extra_args+=("$2"); shift 2 ;;
    --print-tag) print_tag=1; shift ;;
    --print-ps-requirements) ps_requirements; exit 0 ;;
    -h|--help) sed -n '2,46p' "$0"; exit 0 ;;
    *) echo "build-image.sh: error: unknown option $1" >&2; echo "hint: see --help" >&2; exit 2 ;;
  esac
done
if [[ -n "$horovod_wheel" ]] && ! ((with_horovod)); then
  echo "build-image.sh: error: --horovod-wheel needs --with-horovod" >&2; exit 2
fi
if ((layers_only)) && { ! ((with_horovod)) || [[ -n "$horovod_wheel$archive$push" ]]; }; then
  echo "build-image.sh: error: --layers-only goes with --with-horovod, and without --horovod-wheel," \
    "--archive or --push" >&2; exit 2
fi

BASE_REF="mpilaunch.local/debian:bookworm"
if ((local_base)); then base="$BASE_REF"; fi
tf_reqs="" name="mpilaunch"
if ((with_tf)); then tf_reqs="$(ps_requirements)"; name="mpilaunch-tf"; fi

# --with-horovod: the wheel (given, or scripts/build-horovod.sh's), staged in docker/wheels/
# (the Dockerfile's bind mount) under its own name; its sha256 is a build argument and in the tag
HOROVOD_BUILD="$MPILAUNCH_CACHE/mpilaunch-horovod/openmpi"
wheel_sha=""
if ((with_horovod)); then
  name="mpilaunch-horovod"
  ((layers_only)) && name="mpilaunch-horovod-layers"
fi
if ((with_horovod && !layers_only)); then
  if [[ -z "$horovod_wheel" ]]; then
    if ! ((print_tag)); then
      # cached and checked in seconds when built; the same build the tests run
      MPILAUNCH_HOROVOD_FLAVOURS=openmpi scripts/build-horovod.sh >&2
    fi
    [[ -f "$HOROVOD_BUILD/.done" ]] && horovod_wheel="$(ls "$HOROVOD_BUILD"/wheel/horovod-*.whl 2>/dev/null | head -1)"
    if [[ -z "$horovod_wheel" ]]; then
      echo "build-image.sh: error: no Horovod wheel in $HOROVOD_BUILD/wheel (build one with" \
        "MPILAUNCH_HOROVOD_FLAVOURS=openmpi scripts/build-horovod.sh, or name one with --horovod-wheel)" >&2
      exit 1
    fi
  fi
  [[ -f "$horovod_wheel" && "$horovod_wheel" == *.whl ]] || {
    echo "build-image.sh: error: $horovod_wheel is not a wheel file" >&2; exit 1; }
  wheel_sha="$(sha256sum "$horovod_wheel" | cut -d' ' -f1)"
fi

source_hash() {
  { printf 'base=%s\n' "$base"
    [[ -z "$tf_reqs" ]] || printf 'ps=%s\n' "$tf_reqs"
    ((with_horovod == 0)) || printf 'torch=debian\n'
    [[ -z "$wheel_sha" ]] || printf 'horovod=%s\n' "$wheel_sha"
    ((${#extra_args[@]} == 0)) || printf 'arg=%s\n' "${extra_args[@]}"
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
((with_horovod == 0)) || args+=(--build-arg TORCH=debian)
if [[ -n "$wheel_sha" ]]; then
  staged="docker/wheels/$(basename "$horovod_wheel")"
  if ! cmp -s "$horovod_wheel" "$staged"; then  # a copy (renamed into place: a build beside this one reads whole files)
    cp "$horovod_wheel" "$staged.tmp.$$" && mv -f "$staged.tmp.$$" "$staged"
  fi
  args+=(--build-arg "HOROVOD_WHEEL=$(basename "$staged")" --build-arg "HOROVOD_WHEEL_SHA256=$wheel_sha")
fi
for a in "${extra_args[@]}"; do args+=(--build-arg "$a"); done
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
  log "wrote $archive ($(du -m "$archive" | cut -f1) MB)"
fi
if [[ -n "$push" ]]; then
  "${b[@]}" push "$tag" "$push" >&2
  log "pushed $tag to $push"
fi
echo "$tag"
