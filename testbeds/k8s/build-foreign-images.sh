#!/usr/bin/env bash
# Images that no one here prepared for mpilaunch: Debian bookworm plus
# distribution packages only, never mpilaunch (tests/e2e/k8s/test_foreign_image.py runs
# jobs in them on the real node). Idempotent; cached under
# $MPILAUNCH_K8S_CACHE/images/foreign-<name>.{tar,tag}, smoke-checked:
#
#   foreign-openmpi    openmpi-bin + python3-mpi4py (Debian's mpi4py, built on Open MPI 4.1)
#   foreign-mpich      mpich + python3, from Debian trixie (MPICH 4.2.1): bookworm's
#                      MPICH 4.0.2 deadlocks in MPI_Finalize in about 1 of 8 two-pod
#                      jobs (pmodels/mpich#6596, fixed in 4.2). Debian's python3-mpi4py
#                      is built only against Open MPI and would bring Open MPI along and
#                      make it the image's mpirun: ranks here reach MPICH's libmpi
#                      through ctypes
#   foreign-nopython   openmpi-bin alone: no python3 (mpilaunch must refuse it)
#   foreign-mpiop      openmpi-bin + python3-mpi4py + openssh: the worker image Kubeflow's
#                      mpi-operator expects (mpiuser, sshd on 2222; mpiop-image-hook.sh)
#                      with tests/programs/placement.py at /home/mpiuser/placement.py:
#                      the peer of benchmarks/bench_vs_mpi_operator.py, mpilaunch runs it too
#   foreign-mpiop5     the same from Debian trixie: Open MPI 5.0
#   foreign-horovod    python3-torch + openmpi-bin + Horovod's Python dependencies from Debian,
#                      and the Horovod wheel scripts/build-horovod.sh made (against the same
#                      bookworm torch 1.13 and Open MPI 4.1), unpacked into dist-packages: a
#                      user's Horovod image. Only when named: it needs that build first.
#
#   testbeds/k8s/build-foreign-images.sh [NAME...]   # default: the first three
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
source "$REPO/scripts/lib.sh"
CACHE="${MPILAUNCH_K8S_CACHE:-$MPILAUNCH_CACHE/mpilaunch-k8s}"
export MPILAUNCH_BUILDAH_ROOT="${MPILAUNCH_BUILDAH_ROOT:-$CACHE/buildah}"
MIRROR="${MPILAUNCH_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# bump when the recipe changes: every image's tag covers it
RECIPE=1

declare -A PACKAGES=(
  [openmpi]="openmpi-bin,python3-mpi4py"
  [mpich]="mpich,python3-minimal,libpython3-stdlib"
  [nopython]="openmpi-bin"
  [mpiop]="openmpi-bin,python3-mpi4py,openssh-server,openssh-client"
  [mpiop5]="openmpi-bin,python3-mpi4py,openssh-server,openssh-client"
  [horovod]="python3-torch,openmpi-bin,python3-cloudpickle,python3-psutil,python3-yaml,python3-packaging"
)
# (none yet on a first run: scripts/test builds Horovod beside this; only `horovod` needs it)
HOROVOD_WHEEL="${MPILAUNCH_HOROVOD_WHEEL:-$(ls "$MPILAUNCH_CACHE"/mpilaunch-horovod/openmpi/wheel/horovod-*.whl 2>/dev/null | head -1 || true)}"
SITE=usr/local/lib/python3.11/dist-packages
# what each image must hold (paths in its root file system), and must not
declare -A MUST=(
  [openmpi]="usr/bin/mpirun.openmpi usr/bin/python3 usr/lib/python3/dist-packages/mpi4py/__init__.py"
  [mpich]="usr/bin/mpirun.mpich usr/bin/python3"
  [nopython]="usr/bin/mpirun.openmpi"
  [mpiop]="usr/bin/mpirun.openmpi usr/bin/python3 usr/sbin/sshd home/mpiuser/placement.py home/mpiuser/.sshd_config"
  [mpiop5]="usr/bin/mpirun.openmpi usr/bin/python3 usr/sbin/sshd home/mpiuser/placement.py home/mpiuser/.sshd_config"
  [horovod]="usr/bin/mpirun.openmpi usr/bin/python3 $SITE/horovod/torch/__init__.py usr/lib/python3/dist-packages/torch/__init__.py"
)
declare -A MUST_NOT=([mpiop]="" [mpiop5]="" [openmpi]="" [mpich]="usr/bin/mpirun.openmpi" [nopython]="usr/bin/python3" [horovod]="")
# the Debian release each image is built from (bookworm unless named here)
declare -A SUITE=([mpich]=trixie [mpiop5]=trixie)
suite_of() { echo "${SUITE[$1]:-bookworm}"; }

# what else a tag covers: the Horovod wheel, a release other than bookworm (bookworm tags stay as they were)
MPIOP_HOOK="$HERE/mpiop-image-hook.sh" MPIOP_PROGRAM="$REPO/tests/programs/placement.py"
extra_of() {
  [[ "$1" != horovod ]] || sha256sum "$HOROVOD_WHEEL" | cut -c1-16
  [[ "$1" != mpiop* ]] || cat "$MPIOP_HOOK" "$MPIOP_PROGRAM" | sha256sum | cut -c1-16
  [[ "$(suite_of "$1")" == bookworm ]] || suite_of "$1"
}
tag_of() { printf 'mpilaunch.local/foreign-%s:%s\n' "$1" "$(printf '%s|%s|%s|%s' "$RECIPE" "${PACKAGES[$1]}" "$MIRROR" "$(extra_of "$1")" | sha256sum | cut -c1-12)"; }

# the archive's root file system has what it must and lacks what it must not
smoke_check() {
  local name="$1" archive="$2" listing path
  listing="$(mktemp)"
  # a docker-archive holds one layer tarball: list its paths
  tar -xOf "$archive" --wildcards '*.tar' 2>/dev/null | tar -t 2>/dev/null | sed 's|^\./||' >"$listing" || true
  for path in ${MUST[$name]}; do
    grep -qx "$path" "$listing" || { log "foreign-$name: $path missing"; rm -f "$listing"; return 1; }
  done
  for path in ${MUST_NOT[$name]}; do
    ! grep -qx "$path" "$listing" || { log "foreign-$name: $path present"; rm -f "$listing"; return 1; }
  done
  rm -f "$listing"
}

build_one() {
  local name="$1" tag archive tagfile rootfs ctr t0=$SECONDS hooks=()
  if [[ "$name" == horovod ]]; then
    [[ -f "$HOROVOD_WHEEL" ]] || { log "foreign-horovod: no Horovod wheel (run scripts/build-horovod.sh)"; return 1; }
    # a wheel is a zip: unpacked into the image's site packages, as pip would without its metadata scripts
    hooks=(--customize-hook="python3 -m zipfile -e '$HOROVOD_WHEEL' \"\$1/$SITE\"")
  fi
  [[ "$name" != mpiop* ]] || hooks=(--customize-hook="sh '$MPIOP_HOOK' \"\$1\" '$MPIOP_PROGRAM'")
  tag="$(tag_of "$name")"
  archive="$CACHE/images/foreign-$name.tar" tagfile="$CACHE/images/foreign-$name.tag"
  if [[ "$(cat "$tagfile" 2>/dev/null)" == "$tag" && -f "$archive" ]] && smoke_check "$name" "$archive"; then
    return 0
  fi
  log "foreign-$name: mmdebstrap $(suite_of "$name") minbase + ${PACKAGES[$name]}"
  rootfs="$(mktemp -d)"
  mmdebstrap --quiet --variant=minbase --include="${PACKAGES[$name]}" "${hooks[@]}" "$(suite_of "$name")" "$rootfs/rootfs.tar" "$MIRROR"
  b=(buildah --root "$MPILAUNCH_BUILDAH_ROOT/storage" --runroot "$MPILAUNCH_BUILDAH_ROOT/run" --storage-driver overlay)
  ctr="$("${b[@]}" from scratch)"
  "${b[@]}" add "$ctr" "$rootfs/rootfs.tar" / >/dev/null
  "${b[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd /bin/sh "$ctr"
  "${b[@]}" commit --quiet --rm "$ctr" "$tag" >/dev/null
  rm -f "$archive.tmp"
  "${b[@]}" push --quiet "$tag" "docker-archive:$archive.tmp:$tag"
  rm -rf "$rootfs"
  smoke_check "$name" "$archive.tmp" || { rm -f "$archive.tmp"; log "foreign-$name: smoke check failed"; return 1; }
  mv -f "$archive.tmp" "$archive"
  echo "$tag" >"$tagfile"
  log "foreign-$name: $tag ready in $((SECONDS - t0))s"
}

apt_ensure buildah mmdebstrap
mkdir -p "$CACHE/images"
for name in "${@:-openmpi mpich nopython}"; do
  for n in $name; do build_one "$n"; done
done
