#!/usr/bin/env bash
# The unprivileged user tests/e2e/test_nonroot.py runs mpilaunch as, and that
# user's own Python environment (idempotent; needs root; called by
# scripts/test and by the test module's session fixture).
#
#   user:  $MPILAUNCH_NONROOT_USER (default mpilaunch-user), `useradd -m` when missing
#   venv:  ~USER/.cache/mpilaunch-venv, made BY the user from Debian's
#          /usr/bin/python3 with --system-site-packages (Debian's python3-psutil,
#          mpilaunch's one core dependency), plus the k8s and yarn extras from
#          PyPI (pip cache ~USER/.cache/mpilaunch-pip), and mpilaunch from this
#          checkout through a .pth file (an editable install would write into
#          the root-owned checkout) with its two console scripts.
#
# The venv is not under $MPILAUNCH_CACHE like every other cached piece: the
# default cache is in /root, which is mode 700, and no other user can reach
# anything in it (a `mktemp -d` cache is 700 too). It lives in the user's
# own ~/.cache instead, where a real user's would, keyed (.mpilaunch-key) by
# this script, Debian's python and psutil, pyproject.toml and the checkout's
# path: a stale one is rebuilt, and one that fails its smoke check (run as
# the user) is rebuilt once, then fails loudly. Prints the venv's path.
self="$(realpath "$0")"
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { log "ERROR: $0 creates a user: run it as root"; exit 1; }

user="${MPILAUNCH_NONROOT_USER:-mpilaunch-user}"
# one at a time: scripts/test and a test session's fixture may both get here
exec 9>"/tmp/mpilaunch-nonroot-setup.lock"
flock 9
# python3-venv: ensurepip for Debian's python; python3-psutil: the core's dependency;
# openmpi-bin: the system-wide mpirun the user's local jobs use.
apt_ensure python3-venv python3-psutil openmpi-bin

if ! id -u "$user" >/dev/null 2>&1; then
  log "creating user $user"
  useradd -m -s /bin/bash -c "mpilaunch tests (unprivileged)" "$user"
fi
home="$(getent passwd "$user" | cut -d: -f6)"
[ -d "$home" ] || { mkdir -p "$home"; chown "$user:" "$home"; }
venv="$home/.cache/mpilaunch-venv"
repo="$(pwd -P)"

# Runs as the user with a clean environment (no root leftovers); pip's own
# settings (index, certificates, find-links) are the machine's, not root's.
as_user() {
  local pass=() v
  for v in $(compgen -e); do
    case "$v" in PIP_CACHE_DIR) ;; PIP_*|*_proxy|*_PROXY) pass+=("$v=${!v}") ;; esac
  done
  (cd "$home" && runuser -u "$user" -- env -i HOME="$home" USER="$user" LOGNAME="$user" \
    PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 PIP_CACHE_DIR="$home/.cache/mpilaunch-pip" \
    PIP_DISABLE_PIP_VERSION_CHECK=1 "${pass[@]}" "$@")
}

extras() {  # the k8s and yarn extras of pyproject.toml, one requirement a line
  /usr/bin/python3 -c '
import sys, tomllib
extras = tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"]
print("\n".join(sorted(set(extras["k8s"] + extras["yarn"]))))' pyproject.toml
}
key() {
  { cat "$self"; /usr/bin/python3 --version; dpkg-query -W python3-psutil; cat pyproject.toml; echo "$repo"; } \
    | sha256sum | cut -c1-16
}
smoke() {
  as_user "$venv/bin/python" -c '
import importlib.util, os, sys
import warnings  # a mismatched mix of packages warns at import: an error here
warnings.simplefilter("error"); warnings.simplefilter("ignore", DeprecationWarning); warnings.simplefilter("ignore", PendingDeprecationWarning)
import psutil, kubernetes, jinja2, rich, skein
assert psutil.__file__.startswith("/usr/lib/python3/dist-packages/"), psutil.__file__
# where mpilaunch comes from, without importing it: a checkout mid-edit is no broken venv
origin = importlib.util.find_spec("mpilaunch").origin
here = os.path.realpath(sys.argv[1])
assert os.path.realpath(origin).startswith(here + os.sep), f"mpilaunch comes from {origin}, not {here}"
' "$repo" && as_user test -x "$venv/bin/mpilaunch" -a -x "$venv/bin/mpilaunch-rsh"
}
build() {
  log "building $user's venv $venv (Debian's $(/usr/bin/python3 --version))"
  rm -rf "$venv"
  as_user mkdir -p "$home/.cache"
  as_user /usr/bin/python3 -m venv --system-site-packages "$venv"
  local reqs
  mapfile -t reqs < <(extras)
  # --ignore-installed: the extras and all they need go into the venv, none resolved to
  # Debian's copies in the system site-packages (Debian's requests next to PyPI's urllib3
  # warned on every import); psutil, needed by no extra, stays Debian's. --no-compile: the
  # modules a job imports are compiled (and their .pyc written) on first use, not all of them.
  as_user "$venv/bin/python" -m pip install -q --no-compile --ignore-installed "${reqs[@]}"
  # mpilaunch from this checkout, and the console scripts `pip install` would write
  local site
  site="$(as_user "$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
  as_user sh -c "echo '$repo' >'$site/mpilaunch-checkout.pth'"
  local name module
  for name in mpilaunch:mpilaunch.cli mpilaunch-rsh:mpilaunch.rsh_agent.shim; do
    module="${name#*:}"; name="${name%%:*}"
    as_user sh -c "printf '%s\n' '#!$venv/bin/python' 'import sys' 'from $module import main' 'sys.exit(main())' >'$venv/bin/$name' && chmod 755 '$venv/bin/$name'"
  done
  as_user sh -c "echo $(key) >'$venv/.mpilaunch-key'"
}

if [ "$(cat "$venv/.mpilaunch-key" 2>/dev/null)" != "$(key)" ]; then
  build
fi
smoke_log="$(mktemp)"
trap 'rm -f "$smoke_log"' EXIT
if ! smoke >"$smoke_log" 2>&1; then
  log "$user's venv fails its smoke check ($(tail -1 "$smoke_log")): rebuilding it"
  build
  smoke || { log "ERROR: $user's fresh venv still fails its smoke check"; exit 1; }
fi
echo "$venv"
