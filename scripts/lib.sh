# Shared helpers for the project's install scripts (sourced, not run).
set -euo pipefail
MPILAUNCH_CACHE="${MPILAUNCH_CACHE:-$HOME/.cache}"
log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# apt packages, installed only when missing (idempotent, no update when present).
apt_ensure() {
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if ((${#missing[@]})); then
    log "apt-get install ${missing[*]}"
    local sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}
