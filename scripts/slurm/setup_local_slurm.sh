#!/usr/bin/env bash
# A real single-node SLURM cluster on this machine, for trying the SLURM profile
# (profiles/slurm) and for tests/test_slurm.py. Idempotent: rerunning it keeps a running
# cluster as it is, and restarts the daemons only when slurm.conf changed.
#
#   sudo bash scripts/slurm/setup_local_slurm.sh      # Debian/Ubuntu; needs root for apt
#
# One node (this host, `hostname -s`) with the CPUs and memory `slurmd -C` reports, one
# partition `debug` (the default), select/cons_tres. No accounting database: `sacct` does not
# work here, and finished jobs stay visible to `squeue` for MinJobAge (1 h), so local runs query
# job states with squeue (`--slurm-status-command squeue`). No GPU gres is configured.
set -euo pipefail

CONF_DIR=/etc/slurm
CONF="$CONF_DIR/slurm.conf"
CLUSTER=${SLURM_CLUSTER_NAME:-eagleflow}
LOG_DIR=/var/log/slurm
STATE_DIR=/var/lib/slurm

if [ "$(id -u)" -ne 0 ]; then
  echo "setup_local_slurm.sh: run as root (apt-get, daemons, /etc/slurm)" >&2
  exit 1
fi

# 1. Packages (only what is missing).
missing=()
for cmd in slurmctld slurmd sinfo munged; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing slurm-wlm and munge (missing: ${missing[*]})"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends slurm-wlm munge
fi

# 2. Munge: a key, then the daemon (as user munge).
if [ ! -s /etc/munge/munge.key ]; then
  echo "creating /etc/munge/munge.key"
  if command -v mungekey >/dev/null 2>&1; then
    mungekey --create --keyfile=/etc/munge/munge.key --force
  else
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
  fi
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key
install -d -o munge -g munge -m 0755 /run/munge
install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  echo "starting munged"
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 1 20); do
    munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break
    sleep 0.5
  done
  munge -n | unmunge >/dev/null
fi

# 3. slurm.conf: one node = this host, as slurmd itself measures it.
host=$(hostname -s)
slurm_user=slurm
id "$slurm_user" >/dev/null 2>&1 || slurm_user=root
# e.g. "NodeName=vm CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1
# RealMemory=24152"; keep the hardware fields, leave a little memory to the system.
node_line=$(slurmd -C | head -n 1)
real_memory=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$node_line")
hardware=$(tr ' ' '\n' <<<"$node_line" |
  grep -E '^(CPUs|Boards|SocketsPerBoard|CoresPerSocket|ThreadsPerCore)=' | tr '\n' ' ')
usable_memory=$((real_memory * 95 / 100))

install -d -m 0755 "$CONF_DIR"
install -d -o "$slurm_user" -g "$slurm_user" -m 0755 \
  "$LOG_DIR" "$STATE_DIR" "$STATE_DIR/slurmctld" "$STATE_DIR/slurmd"

new_conf=$(mktemp)
trap 'rm -f "$new_conf"' EXIT
cat >"$new_conf" <<EOF
# Written by eagleflow scripts/slurm/setup_local_slurm.sh: a single-node test cluster.
ClusterName=$CLUSTER
SlurmctldHost=$host(127.0.0.1)
SlurmUser=$slurm_user
AuthType=auth/munge
CryptoType=crypto/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
ReturnToService=2
# Finished jobs stay in squeue this long (no accounting database for sacct here).
MinJobAge=3600
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$STATE_DIR/slurmctld
SlurmdSpoolDir=$STATE_DIR/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
SlurmctldTimeout=30
SlurmdTimeout=60
NodeName=$host NodeAddr=127.0.0.1 ${hardware}RealMemory=$usable_memory State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF

conf_changed=0
if ! cmp -s "$new_conf" "$CONF"; then
  install -m 0644 "$new_conf" "$CONF"
  conf_changed=1
  echo "wrote $CONF"
fi

# 4. Daemons: start what is not running; restart both when the configuration changed.
running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
stop() {
  if running "$1"; then
    kill "$(cat "$1")"
    for _ in $(seq 1 40); do
      running "$1" || break
      sleep 0.25
    done
  fi
}
if [ "$conf_changed" = 1 ]; then
  stop /run/slurmd.pid
  stop /run/slurmctld.pid
fi
if ! running /run/slurmctld.pid; then
  echo "starting slurmctld"
  /usr/sbin/slurmctld
fi
for _ in $(seq 1 60); do
  scontrol ping 2>/dev/null | grep -q UP && break
  sleep 0.5
done
if ! running /run/slurmd.pid; then
  echo "starting slurmd"
  /usr/sbin/slurmd
fi

# 5. Wait until the node is idle (a node left DOWN or DRAINED by an earlier run is resumed).
state=""
for i in $(seq 1 120); do
  state=$(sinfo -h -N -n "$host" -o '%T' 2>/dev/null | head -n 1 || true)
  case "$state" in
    idle | mixed | allocated) break ;;
    down* | drain* | drained*)
      if [ $((i % 10)) = 1 ]; then scontrol update NodeName="$host" State=RESUME || true; fi
      ;;
  esac
  sleep 1
done
sinfo
case "$state" in
  idle | mixed | allocated) echo "SLURM ready: node $host is $state" ;;
  *)
    echo "node $host is '${state:-unknown}'; see $LOG_DIR/slurmctld.log and slurmd.log" >&2
    exit 1
    ;;
esac
