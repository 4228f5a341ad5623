#!/usr/bin/env bash
# Build Horovod (PyTorch, MPI and Gloo; CPU) once, check it, and cache it.
#
# What it is built against (why: README, "Set up"): Debian's python3-torch
# 1.13 (CPU, gloo; libtorch-dev's headers) for /usr/bin/python3 and Debian's
# Open MPI 4.1 (mpicxx.openmpi). PyPI's torch for Linux brings about 3 GB of
# CUDA wheels; Debian's needs nothing beyond what the suite installs anyway.
#
# Horovod 0.28.1 is the last release. Its CMake asks for C++14 (top level and
# horovod/torch), which torch >= 2.1 refuses; the sdist is patched to C++17,
# which torch 1.13 accepts too, so the same build works for either torch
# (an image with PyPI's torch 2.x rebuilds from this script with
# MPILAUNCH_HOROVOD_PYTHON pointing at it).
#
# Cache: $MPILAUNCH_CACHE/mpilaunch-horovod/openmpi-<key>, where the key
# hashes every input that changes the result (Horovod version, the patch and
# build settings, torch version, Open MPI package and mpi.h, compiler and
# CMake, Python version and ABI); `openmpi` is a symlink to the current
# build. Each build holds
#   wheel/horovod-*.whl   the built wheel (an image build installs this one)
#   venv/                 /usr/bin/python3's site packages + that wheel: the
#                         interpreter the tests run (venv/bin/python,
#                         venv/bin/horovodrun)
# A build is cached only after its check passes (`horovodrun --check-build`
# lists PyTorch and the MPI and Gloo controllers, `import horovod.torch`
# works, and a 2-rank allreduce is right with the MPI controller under
# mpirun.openmpi and with the Gloo one under horovodrun --gloo); a cached
# build is checked again (the first two only) before every use and rebuilt
# when that fails.
source "$(dirname "$0")/lib.sh"
# cmake, g++: the build; libtorch-dev: torch's headers (python3-torch has none)
apt_ensure openmpi-bin libopenmpi-dev cmake g++ python3-venv
apt_ensure --no-install-recommends python3-torch libtorch-dev

HVD_VERSION="${MPILAUNCH_HOROVOD_VERSION:-0.28.1}"
PY="${MPILAUNCH_HOROVOD_PYTHON:-/usr/bin/python3}"
MPICXX=/usr/bin/mpicxx.openmpi
MPIRUN=/usr/bin/mpirun.openmpi
CXX_STANDARD=17
# What the build is told (HOROVOD_GPU_OPERATIONS unset: CPU only). Every other
# HOROVOD_* of the caller's environment is dropped (the build runs in env -i).
BUILD_FLAGS=(HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1
             HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1)
# Two cores here, shared with other builds; setup.py's own default is -j8.
MAKEFLAGS="-j${MPILAUNCH_HOROVOD_JOBS:-2}"
root="$MPILAUNCH_CACHE/mpilaunch-horovod"
export PIP_CACHE_DIR="${PIP_CACHE_DIR:-$MPILAUNCH_CACHE/mpilaunch-pip}"
mkdir -p "$root"

# the installed distribution's version: importing torch costs seconds
torch_ver=$("$PY" -c 'import importlib.metadata as m; print(m.version("torch"))') || {
  log "ERROR: $PY has no torch (apt-get install python3-torch, or point MPILAUNCH_HOROVOD_PYTHON at one that has)"
  exit 1
}
py_full=$("$PY" -c 'import sys; print(sys.version.split()[0], sys.implementation.cache_tag, sys.executable)')
mpi_ver=$(dpkg-query -W -f='${Version}' libopenmpi-dev)
mpi_h=$("$MPICXX" -showme:incdirs | tr ' ' '\n' | while read -r d; do [ -f "$d/mpi.h" ] && echo "$d/mpi.h" && break; done)
key=$(printf '%s\n' "horovod $HVD_VERSION" "c++$CXX_STANDARD" "${BUILD_FLAGS[*]}" \
        "torch $torch_ver $(dpkg-query -W -f='${Version}' libtorch-dev 2>/dev/null)" \
        "openmpi $mpi_ver $(sha256sum "$mpi_h" | cut -c1-16)" \
        "$(g++ --version | head -1)" "$(cmake --version | head -1)" "$py_full" \
      | sha256sum | cut -c1-16)
dest="$root/openmpi-$key"
quiet_mpi=(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader,tcp
           OMPI_MCA_rmaps_base_oversubscribe=1)

# quick_check DIR: the build's own report and one import (before every use).
quick_check() {
  local dir="$1" out
  out=$(cd / && timeout 120 "$dir/venv/bin/horovodrun" --check-build 2>&1) || {
    log "horovodrun --check-build fails in $dir: $(tail -3 <<<"$out")"; return 1; }
  # the controllers' section must tick both; the frameworks' must tick PyTorch
  if ! awk '/Available Controllers/{c=1;next} /Available/{c=0} c&&/\[X\] MPI/{m=1} c&&/\[X\] Gloo/{g=1} /\[X\] PyTorch/{p=1}
            END{exit !(m&&g&&p)}' <<<"$out"; then
    log "horovodrun --check-build in $dir does not list PyTorch, MPI and Gloo: $(tr '\n' ' ' <<<"$out")"
    return 1
  fi
  out=$(cd / && env "${quiet_mpi[@]}" timeout 120 "$dir/venv/bin/python" -c \
        'import horovod, horovod.torch as hvd; assert hvd.mpi_built() and hvd.gloo_built(); print(horovod.__version__)' 2>&1) || {
    log "import horovod.torch fails in $dir: $(tail -3 <<<"$out")"; return 1; }
  [ "$(tail -1 <<<"$out")" = "$HVD_VERSION" ] || { log "$dir has horovod $(tail -1 <<<"$out"), not $HVD_VERSION"; return 1; }
}

# run_check DIR: a 2-rank allreduce with each controller (after a build):
# MPI under mpirun.openmpi, Gloo under horovodrun --gloo (its own HTTP
# rendezvous; both ranks on localhost, so no ssh). Mixing them under mpirun
# (HOROVOD_CONTROLLER=mpi with HOROVOD_CPU_OPERATIONS=gloo, or the reverse)
# crashes in 0.28.1 (SIGSEGV in GlooAlgorithms::Allreduce, MPI_ERR_COMM):
# not a combination to check.
run_check() {
  local dir="$1" launch out
  local prog='
import torch, horovod.torch as hvd
hvd.init()
s = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item()
assert (hvd.size(), s) == (2, 3.0), (hvd.size(), s)
# every rank checks (a failed assert fails the launch); one prints (ranks interleave)
if hvd.rank() == 0:
    print("ok", hvd.size(), "mpi" if hvd.mpi_enabled() else "gloo" if hvd.gloo_enabled() else "?")'
  for launch in "$MPIRUN -np 2" "$dir/venv/bin/horovodrun --gloo -np 2 -H localhost:2"; do
    out=$(cd / && env "${quiet_mpi[@]}" timeout 180 $launch "$dir/venv/bin/python" -c "$prog" 2>&1) || {
      log "2-rank allreduce under ${launch%% *} fails: $(tail -5 <<<"$out")"; return 1; }
    case "$launch" in *--gloo*) want=gloo ;; *) want=mpi ;; esac
    grep -Eq "ok 2 $want\$" <<<"$out" || {
      log "2-rank allreduce ($want) under ${launch%% *}: $(tail -5 <<<"$out")"; return 1; }
  done
}

if [ -f "$dest/.done" ]; then
  if quick_check "$dest"; then
    ln -sfn "$dest" "$root/openmpi"
    log "horovod $HVD_VERSION (torch $torch_ver, Open MPI $mpi_ver): cached and checked ($dest)"
    exit 0
  fi
  log "cached horovod failed its check: rebuilding"
fi

log "building horovod $HVD_VERSION against torch $torch_ver ($PY) and Open MPI $mpi_ver (C++$CXX_STANDARD, $MAKEFLAGS)"
# Built in place (a venv's scripts name their interpreter by absolute path);
# without .done it is never used, and the next run starts it over.
rm -rf "$dest"
mkdir -p "$dest/src"
# A venv over the interpreter's own site packages (torch, numpy, psutil, yaml,
# setuptools and wheel from Debian): setup.py imports torch, so no isolation.
# Its pip also fetches the sdist (Debian's python3 may have no pip of its own).
"$PY" -m venv --system-site-packages "$dest/venv"
"$dest/venv/bin/python" -m pip install -q --disable-pip-version-check packaging cloudpickle
sdist="$root/sdist/horovod-$HVD_VERSION.tar.gz"
if [ ! -s "$sdist" ]; then
  log "downloading the horovod $HVD_VERSION sdist"
  rm -rf "$root/sdist.tmp"
  "$dest/venv/bin/python" -m pip download -q --disable-pip-version-check --no-binary :all: --no-deps \
    -d "$root/sdist.tmp" "horovod==$HVD_VERSION"
  mkdir -p "$root/sdist"
  mv "$root/sdist.tmp/horovod-$HVD_VERSION.tar.gz" "$sdist"
  rm -rf "$root/sdist.tmp"
fi
tar -xzf "$sdist" -C "$dest/src" --strip-components=1
cmakelists=("$dest/src/CMakeLists.txt" "$dest/src/horovod/torch/CMakeLists.txt")
sed -i "s/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD $CXX_STANDARD)/" "${cmakelists[@]}"
if grep -q "CMAKE_CXX_STANDARD 14" "${cmakelists[@]}"; then
  log "ERROR: the C++ standard patch did not apply to horovod $HVD_VERSION's CMakeLists"; exit 1
fi
# FindMPI takes the first mpicxx on PATH: Debian's Open MPI, by name.
mkdir -p "$dest/mpibin"
ln -s "$MPICXX" "$dest/mpibin/mpicxx"
ln -s /usr/bin/mpicc.openmpi "$dest/mpibin/mpicc"
t0=$SECONDS
if ! (cd "$dest/src" && env -i HOME="$HOME" TMPDIR="${TMPDIR:-/tmp}" PATH="$dest/mpibin:/usr/bin:/bin" \
        LANG=C.UTF-8 MAKEFLAGS="$MAKEFLAGS" "${BUILD_FLAGS[@]}" \
        "$dest/venv/bin/python" -m pip wheel -v --disable-pip-version-check --no-build-isolation \
        --no-deps -w "$dest/wheel" . >"$dest/build.log" 2>&1); then
  log "ERROR: the horovod build failed after $((SECONDS - t0)) s; last lines of $dest/build.log:"
  tail -30 "$dest/build.log" >&2
  exit 1
fi
log "horovod compiled in $((SECONDS - t0)) s"
"$dest/venv/bin/python" -m pip install -q --disable-pip-version-check "$dest"/wheel/horovod-*.whl
rm -rf "$dest/src" "$dest/mpibin"
if ! quick_check "$dest" || ! run_check "$dest"; then
  log "ERROR: the horovod build failed its check; not cached (left in $dest to inspect)"
  exit 1
fi
touch "$dest/.done"
ln -sfn "$dest" "$root/openmpi"
# builds for inputs that are gone (110 MB each)
for old in "$root"/openmpi-*; do
  [ "$old" = "$dest" ] || rm -rf "$old"
done
log "horovod $HVD_VERSION built and checked ($dest; wheel: $(ls "$dest"/wheel/*.whl))"
