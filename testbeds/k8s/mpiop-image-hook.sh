#!/bin/sh
# mmdebstrap customize hook for the foreign-mpiop images (build-foreign-images.sh):
# the worker image Kubeflow's mpi-operator expects, made the way its own examples
# describe it (an unprivileged user whose sshd listens on 2222 and reads its host
# key and authorized_keys from the Secret the operator mounts at ~/.ssh), written
# here from that description, plus the rank program the mpilaunch side runs.
#   mpiop-image-hook.sh ROOTFS PROGRAM
set -eu
root="$1" program="$2"
chroot "$root" useradd --create-home --uid 1000 --shell /bin/bash mpiuser
mkdir -p "$root/run/sshd"
# the launcher's ssh: the workers' host keys are new in every job; ~/.ssh is a read-only Secret
cat >"$root/etc/ssh/ssh_config.d/mpi.conf" <<'CONF'
Host *
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    Port 2222
CONF
# the workers' sshd, run as mpiuser: `sshd -De -f /home/mpiuser/.sshd_config`
cat >"$root/home/mpiuser/.sshd_config" <<'CONF'
Port 2222
PidFile /home/mpiuser/sshd.pid
HostKey /home/mpiuser/.ssh/id_rsa
StrictModes no
CONF
# the launcher waits until every host of the operator's hostfile resolves: a worker's DNS
# record appears only once it is Ready, and the launcher starts with the workers
cat >"$root/usr/local/bin/wait-hosts" <<'CONF'
#!/bin/sh
# wait-hosts CMD...: wait (at most 60 s) until each host in /etc/mpi/hostfile resolves, then exec CMD
for host in $(cut -d' ' -f1 /etc/mpi/hostfile 2>/dev/null | cut -d: -f1); do
    i=0
    until getent hosts "$host" >/dev/null; do
        i=$((i + 1)); [ "$i" -le 600 ] || { echo "wait-hosts: $host does not resolve" >&2; break; }
        sleep 0.1
    done
done
exec "$@"
CONF
chmod 755 "$root/usr/local/bin/wait-hosts"
cp "$program" "$root/home/mpiuser/placement.py"
chroot "$root" chown -R mpiuser:mpiuser /home/mpiuser
