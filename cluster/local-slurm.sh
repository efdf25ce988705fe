#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for CI and for trying simpipe's SLURM mode on a
# workstation (Debian/Ubuntu slurm-wlm 22.05+, run as root).
#
#   bash cluster/local-slurm.sh up     # idempotent: a second `up` changes nothing
#   bash cluster/local-slurm.sh down   # scancel everything, stop the daemons, remove state
#   bash cluster/local-slurm.sh status
#
# The config goes to /etc/slurm/slurm.conf (where sinfo/sbatch look by default), so any new
# shell can use the cluster without SLURM_CONF. State, spool, logs and pid files live under
# $SIMPIPE_SLURM_DIR (default /var/tmp/simpipe-slurm). Daemons are started here, not by the
# service manager: apt's own service start is blocked on CI machines (policy-rc.d).
#
# Environment:
#   SIMPIPE_SLURM_DIR   scratch directory (default /var/tmp/simpipe-slurm)
#   SIMPIPE_SLURM_AUTH  munge | none (default: munge when munged is installed)
#   SIMPIPE_SLURM_CONF  where to write the config (default /etc/slurm/slurm.conf)
set -euo pipefail

DIR=${SIMPIPE_SLURM_DIR:-/var/tmp/simpipe-slurm}
CONF=${SIMPIPE_SLURM_CONF:-/etc/slurm/slurm.conf}
MARK="# written by simpipe cluster/local-slurm.sh"
if [ -z "${SIMPIPE_SLURM_AUTH:-}" ]; then
  if command -v munged >/dev/null 2>&1; then SIMPIPE_SLURM_AUTH=munge; else SIMPIPE_SLURM_AUTH=none; fi
fi
export SLURM_CONF=$CONF

die() { echo "local-slurm: $*" >&2; exit 1; }

alive() {  # alive PIDFILE: the pid in it is a running process
  [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

write_conf() {
  local host cpus mem_mb
  host=$(hostname -s)
  cpus=$(nproc --all)
  # A bit under what is free now: slurmd drains a node whose RealMemory exceeds the RAM
  # it sees, and other processes on the machine need room.
  mem_mb=$(awk '/MemTotal/ {printf "%d", $2 / 1024 * 0.85}' /proc/meminfo)
  local auth="auth/munge" cred="cred/munge"
  if [ "$SIMPIPE_SLURM_AUTH" = none ]; then auth="auth/none"; cred="cred/none"; fi
  mkdir -p "$(dirname "$CONF")"
  local tmp
  tmp=$(mktemp)
  cat >"$tmp" <<EOF
$MARK
ClusterName=simpipe-local
# The hostname may not resolve on CI machines: pin it to loopback.
SlurmctldHost=${host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=${auth}
CredType=${cred}
MpiDefault=none
# No cgroups on CI containers: track processes by parent pid, no task confinement.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1024
ReturnToService=2
# Finished jobs leave squeue quickly, so tests can check that nothing is left behind.
MinJobAge=5
KillWait=5
SlurmctldTimeout=30
SlurmdTimeout=30
StateSaveLocation=${DIR}/state
SlurmdSpoolDir=${DIR}/spool
SlurmctldPidFile=${DIR}/run/slurmctld.pid
SlurmdPidFile=${DIR}/run/slurmd.pid
SlurmctldLogFile=${DIR}/log/slurmctld.log
SlurmdLogFile=${DIR}/log/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
NodeName=${host} NodeAddr=127.0.0.1 CPUs=${cpus} RealMemory=${mem_mb} State=UNKNOWN
# Cores are shared by up to 4 jobs (memory is never oversubscribed): inference servers and
# Dask workers mostly wait on each other, and a 2-core CI machine would otherwise run two
# jobs at once.
PartitionName=debug Nodes=${host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
  if [ -f "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
    rm -f "$tmp"
    die "$CONF exists and was not written by this script; move it away or set SIMPIPE_SLURM_CONF"
  fi
  if [ -f "$CONF" ] && cmp -s "$tmp" "$CONF"; then
    rm -f "$tmp"
    return 1  # unchanged
  fi
  install -m 0644 "$tmp" "$CONF"
  rm -f "$tmp"
  return 0
}

start_munge() {
  [ "$SIMPIPE_SLURM_AUTH" = munge ] || return 0
  alive "$DIR/run/munged.pid" && return 0
  [ -s /etc/munge/munge.key ] || die "/etc/munge/munge.key missing: reinstall munge or set SIMPIPE_SLURM_AUTH=none"
  install -d -o munge -g munge -m 0755 /run/munge
  install -d -o munge -g munge -m 0700 "$DIR/munge"
  # munged refuses world-writable directories on its paths, so it gets its own.
  runuser -u munge -- munged --pid-file="$DIR/munge/munged.pid" \
    --log-file="$DIR/munge/munged.log" --seed-file="$DIR/munge/munged.seed"
  for _ in $(seq 50); do [ -S /run/munge/munge.socket.2 ] && break; sleep 0.1; done
  ln -sf "$DIR/munge/munged.pid" "$DIR/run/munged.pid"
}

up() {
  command -v slurmctld >/dev/null || die "slurmctld not found: apt-get install --no-install-recommends slurm-wlm munge"
  [ "$(id -u)" = 0 ] || die "run as root (the daemons run as SlurmUser=root)"
  install -d -m 0755 "$DIR" "$DIR/state" "$DIR/spool" "$DIR/run" "$DIR/log"
  local changed=0
  if write_conf; then changed=1; fi
  start_munge
  if [ $changed = 1 ] && { alive "$DIR/run/slurmctld.pid" || alive "$DIR/run/slurmd.pid"; }; then
    # New settings (e.g. more memory): restart rather than reconfigure, it is one node.
    stop_daemons
  fi
  if ! alive "$DIR/run/slurmctld.pid"; then
    slurmctld
  fi
  if ! alive "$DIR/run/slurmd.pid"; then
    slurmd
  fi
  for _ in $(seq 100); do
    alive "$DIR/run/slurmctld.pid" || die "slurmctld exited; see $DIR/log/slurmctld.log"
    if sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
      echo "local-slurm: up ($(sinfo -h -o '%P %D %c CPUs %m MB %T'))"
      return 0
    fi
    # A node left down/drained by an earlier run comes back.
    scontrol update NodeName="$(hostname -s)" State=RESUME >/dev/null 2>&1 || true
    sleep 0.2
  done
  die "the node did not become idle; see $DIR/log/slurmctld.log and $DIR/log/slurmd.log"
}

stop_pidfile() {  # stop_pidfile FILE: TERM, wait, then KILL
  local f=$1 pid
  [ -s "$f" ] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

stop_daemons() {
  stop_pidfile "$DIR/run/slurmd.pid"
  stop_pidfile "$DIR/run/slurmctld.pid"
}

down() {
  if alive "$DIR/run/slurmctld.pid"; then
    local ids
    ids=$(squeue -h -o %i 2>/dev/null || true)
    if [ -n "$ids" ]; then
      # shellcheck disable=SC2086
      scancel $ids 2>/dev/null || true
      for _ in $(seq 100); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.2; done
    fi
  fi
  stop_daemons
  if [ -s "$DIR/munge/munged.pid" ]; then
    stop_pidfile "$DIR/munge/munged.pid"
  fi
  rm -rf "$DIR"
  if [ -f "$CONF" ] && grep -qF "$MARK" "$CONF"; then rm -f "$CONF"; fi
  echo "local-slurm: down"
}

status() {
  for d in slurmctld slurmd munged; do
    if alive "$DIR/run/$d.pid"; then echo "$d: running (pid $(cat "$DIR/run/$d.pid"))"; else echo "$d: stopped"; fi
  done
  sinfo 2>/dev/null || true
  squeue 2>/dev/null || true
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
