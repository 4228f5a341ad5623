# Shared helpers for the project's install scripts (sourced, not run).
set -euo pipefail
MPILAUNCH_CACHE="${MPILAUNCH_CACHE:-$HOME/.cache}"
log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# apt packages, installed only when missing (idempotent, no update when present).
apt_missing() {
  local pkg
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || echo "$pkg"
  done
}
# A leading --no-install-recommends goes to apt-get install (apt_ensure --no-install-recommends PKG...).
apt_ensure() {
  local opts=()
  if [ "${1:-}" = --no-install-recommends ]; then opts+=("$1"); shift; fi
  [ -n "$(apt_missing "$@")" ] || return 0
  local sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  # scripts/test runs several installers at once (the real-pod node's packages
  # in the background, the MPI packages in front). `apt-get update` does not
  # wait for the lists lock the way install waits for dpkg's
  # (DPkg::Lock::Timeout), so on a fresh machine the second one failed with
  # "Could not get lock /var/lib/apt/lists/lock": take turns on a lock of our
  # own, and look again for what is missing once it is ours.
  (
    flock 9
    local missing=()
    mapfile -t missing < <(apt_missing "$@")
    ((${#missing[@]})) || exit 0
    log "apt-get install ${missing[*]}"
    # still wait for an apt/dpkg outside this project (unattended upgrades)
    local lock=(-o DPkg::Lock::Timeout=600) tries
    for tries in 1 2 3 4 5 6; do
      $sudo apt-get "${lock[@]}" update -qq && break
      ((tries < 6)) || exit 1
      log "apt-get update failed (another apt running?); retrying in 10 s"
      sleep 10
    done
    DEBIAN_FRONTEND=noninteractive $sudo apt-get "${lock[@]}" install -y -qq "${opts[@]}" "${missing[@]}" >/dev/null
  ) 9>"${TMPDIR:-/tmp}/mpilaunch-apt.lock"
}

# ---- phase timing: every setup phase prints its duration and the CPU it used
# (user + system, its processes and theirs), and phase_table prints all of them,
# so a slow phase is visible in every CI log, and so is whether it was slow
# itself or only waited for a busy machine.
declare -A PHASE_T0=() PHASE_SECS=() PHASE_CPU=()
PHASE_ORDER=()
PHASE_CPU_DIR="${PHASE_CPU_DIR:-${TMPDIR:-/tmp}/mpilaunch-phases-$$}"
# The machine's busy and total CPU ticks since boot (/proc/stat's first line).
machine_ticks() { awk '/^cpu /{ print $2+$3+$4+$7+$8, $2+$3+$4+$5+$6+$7+$8 }' /proc/stat; }
MACHINE_TICKS0="$(machine_ticks)"
# write_cpu_secs FILE: the seconds of CPU this shell and its finished children used (bash's
# `times`; written to a file first: in a pipe it would run in a fresh subshell, which has used none).
write_cpu_secs() {
  times >"$1.times"
  awk '{ for (i = 1; i <= NF; i++) { split($i, t, /[ms]/); n += t[1] * 60 + t[2] } } END { printf "%d\n", n }' \
    "$1.times" >"$1" && rm -f "$1.times"
}
phase_start() {
  mkdir -p "$PHASE_CPU_DIR" && rm -f "$PHASE_CPU_DIR/$1.cpu"
  PHASE_T0[$1]=$(date +%s); PHASE_ORDER+=("$1"); log "phase $1: start"
}
phase_end() {
  PHASE_SECS[$1]=$(( $(date +%s) - PHASE_T0[$1] ))
  PHASE_CPU[$1]=$(cat "$PHASE_CPU_DIR/$1.cpu" 2>/dev/null || echo "-")
  log "phase $1: ${PHASE_SECS[$1]} s (CPU ${PHASE_CPU[$1]} s)"
}
# run_phase NAME CMD...: CMD in a subshell in front (its output where ours goes), timed.
run_phase() {
  local name="$1"; shift
  phase_start "$name"
  ( "$@"; write_cpu_secs "$PHASE_CPU_DIR/$name.cpu" )
  phase_end "$name"
}
# run_phase_bg NAME LOG CMD...: run CMD in the background, its own end time
# recorded (not the time somebody waited for it) in LOG.end, which exists only
# once CMD succeeded (an earlier run's is removed first). Sets PHASE_PID[NAME].
declare -A PHASE_PID=()
run_phase_bg() {
  local name="$1" logfile="$2"; shift 2
  rm -f "$logfile.end"
  phase_start "$name"
  ( "$@" >"$logfile" 2>&1; rc=$?; date +%s >"$logfile.end"; write_cpu_secs "$PHASE_CPU_DIR/$name.cpu"; exit $rc ) &
  PHASE_PID[$name]=$!
}
# wait_phase NAME LOG: wait for a background phase; on failure show its log and stop.
wait_phase() {
  local name="$1" logfile="$2" rc=0
  wait "${PHASE_PID[$name]}" || rc=$?
  if [ -f "$logfile.end" ]; then
    PHASE_SECS[$name]=$(( $(cat "$logfile.end") - PHASE_T0[$name] ))
  else
    PHASE_SECS[$name]=$(( $(date +%s) - PHASE_T0[$name] ))
  fi
  PHASE_CPU[$name]=$(cat "$PHASE_CPU_DIR/$name.cpu" 2>/dev/null || echo "-")
  if [ "$rc" != 0 ]; then
    log "phase $name FAILED (rc=$rc) after ${PHASE_SECS[$name]} s; last lines of $logfile:"
    tail -40 "$logfile" >&2
    exit 1
  fi
  log "phase $name: ${PHASE_SECS[$name]} s, CPU ${PHASE_CPU[$name]} s (background; log $logfile)"
}
# machine_usage_since "BUSY TOTAL" (a machine_ticks line): the machine's CPU seconds since then,
# and how busy it was, in percent of all its cores
machine_usage_since() {
  local busy0 total0 busy1 total1
  read -r busy0 total0 <<<"$1"
  read -r busy1 total1 <<<"$(machine_ticks)"
  echo "$(( (busy1 - busy0) / $(getconf CLK_TCK) )) $(( 100 * (busy1 - busy0) / (total1 - total0 + 1) ))"
}
# The table, and how busy the whole machine was since the script started: near 100%,
# the setup is as short as its CPU allows, and only less work shortens it.
phase_table() {
  local name cpu busy
  printf '%-14s %8s %8s\n' "setup phase" "seconds" "CPU s" >&2
  for name in "${PHASE_ORDER[@]}"; do
    printf '%-14s %8s %8s\n' "$name" "${PHASE_SECS[$name]:-running}" "${PHASE_CPU[$name]:-}" >&2
  done
  read -r cpu busy <<<"$(machine_usage_since "$MACHINE_TICKS0")"
  printf 'the machine (%s cores) was busy %d%% of the time since the start (%d CPU s)\n' "$(nproc)" "$busy" "$cpu" >&2
}

# ensure_venv DIR: a venv whose interpreter runs and matches this machine's
# python3 (version + path recorded in DIR/.mpilaunch-key); otherwise made anew.
# The interpreter behind python3 is what counts: with a venv on PATH (this one
# activated, say) python3 is the venv's own, which keyed it as another python
# and had it made anew on every run.
ensure_venv() {
  local venv="$1" key base
  key="$(python3 -c 'import os, sys
print(sys.version.split()[0], os.path.realpath(getattr(sys, "_base_executable", sys.executable)))')"
  base="${key#* }"
  if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import sys' 2>/dev/null \
     && [ "$(cat "$venv/.mpilaunch-key" 2>/dev/null)" = "$key" ]; then
    return
  fi
  log "creating $venv ($key)"
  # Debian's python3 has no ensurepip without python3-venv; scripts/test starts venvs
  # beside its apt phase, so each one makes sure of it itself (a no-op where it is there)
  "$base" -c 'import ensurepip' 2>/dev/null || apt_ensure python3-venv
  rm -rf "$venv"
  "$base" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
  echo "$key" >"$venv/.mpilaunch-key"
}
