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

# ---- phase timing: every setup phase prints its duration, and phase_table
# prints all of them, so a slow phase is visible in every CI log.
declare -A PHASE_T0=() PHASE_SECS=()
PHASE_ORDER=()
phase_start() { PHASE_T0[$1]=$(date +%s); PHASE_ORDER+=("$1"); log "phase $1: start"; }
phase_end() {
  PHASE_SECS[$1]=$(( $(date +%s) - PHASE_T0[$1] ))
  log "phase $1: ${PHASE_SECS[$1]} s"
}
# run_phase_bg NAME LOG CMD...: run CMD in the background, its own end time
# recorded (not the time somebody waited for it) in LOG.end, which exists only
# once CMD succeeded (an earlier run's is removed first). Sets PHASE_PID[NAME].
declare -A PHASE_PID=()
run_phase_bg() {
  local name="$1" logfile="$2"; shift 2
  rm -f "$logfile.end"
  phase_start "$name"
  ( "$@" >"$logfile" 2>&1; rc=$?; date +%s >"$logfile.end"; exit $rc ) &
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
  if [ "$rc" != 0 ]; then
    log "phase $name FAILED (rc=$rc) after ${PHASE_SECS[$name]} s; last lines of $logfile:"
    tail -40 "$logfile" >&2
    exit 1
  fi
  log "phase $name: ${PHASE_SECS[$name]} s (background; log $logfile)"
}
phase_table() {
  local name
  printf '%-14s %8s\n' "setup phase" "seconds" >&2
  for name in "${PHASE_ORDER[@]}"; do
    printf '%-14s %8s\n' "$name" "${PHASE_SECS[$name]:-running}" >&2
  done
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
