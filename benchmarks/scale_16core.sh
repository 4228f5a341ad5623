#!/usr/bin/env bash
# bench_scale.py at 256/512/1024 local workers on a 16-core machine with the system's Open MPI,
# as the lent Ubuntu 24.04 machine has it (python3 = its venv's, /usr/bin/mpirun = Open MPI 4.1.6,
# OMPI_MCA_plm=isolated left set as its image sets it; mpilaunch runs from this checkout).
#
#   OUT=/tmp/out benchmarks/scale_16core.sh
#
# `true` first (the issue's table), then `python -c pass`; each sweep under its own time limit so
# that one stall cannot eat the other's time. Results: $OUT/{true,python}.{json,log}, $OUT/machine.txt.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/scale-16core}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
MPIRUN=${MPIRUN:-/usr/bin/mpirun}
{
  echo "date: $(date -u +%FT%TZ)"; echo "cores: $(nproc)"; uname -r; grep PRETTY /etc/os-release
  echo "python: $($PY -c 'import sys; print(sys.version.split()[0], sys.prefix)')"
  "$MPIRUN" --version 2>&1 | head -1
  echo "ulimit -n $(ulimit -n) -u $(ulimit -u); pid_max $(cat /proc/sys/kernel/pid_max)"
  echo "OMPI_MCA_plm=${OMPI_MCA_plm:-}"
} | tee "$OUT/machine.txt"
sweep() {  # name, time limit (s), bench_scale.py arguments...
  local name=$1 limit=$2; shift 2
  timeout -k 10 "$limit" "$PY" benchmarks/bench_scale.py --mpi "$MPIRUN" --json "$OUT/$name.json" "$@" \
    2>&1 | tee "$OUT/$name.log"
  echo "$name: exit ${PIPESTATUS[0]}" | tee -a "$OUT/machine.txt"
}
sweep true "${TRUE_LIMIT:-300}" --workers "${TRUE_WORKERS:-32,256,512,1024}" --programs true \
  --runs 3 --warmup 1 --timeout 90
sweep python "${PYTHON_LIMIT:-200}" --workers "${PYTHON_WORKERS:-256,1024}" --programs python \
  --runs 2 --warmup 1 --timeout 90
uptime | tee -a "$OUT/machine.txt"
