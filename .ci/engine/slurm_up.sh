#!/bin/bash
# A 3-node Slurm 22.05 cluster on this machine (root): network namespaces slurm-n1..N on the bridge
# br-slurm (10.215.0.0/24, host side .254) with one slurmd each (started with nsenter, own UTS
# namespace for the node's hostname), slurmctld in a namespace of its own (slurm-ctl, .10, so that
# nothing listens on the host's interfaces), one munged, and slurmrestd on a unix socket running as
# `nobody` (JWT authentication; SLURM_JWT from `scontrol token`). Behind the firewall guard, which
# goes in before any daemon starts. Idempotent (a second run restarts what is gone, such as a
# killed node). Everything is under $SLURM_STATE and recorded there (PIDs) for slurm_down.sh.
#   SLURM_NODES=3  SLURM_STATE=/run/hud-slurm  INSTALL=1 (apt-installs what is missing)
# Clients: SLURM_CONF=$SLURM_STATE/slurm.conf sbatch ...; slurmrestd: unix:$SLURM_STATE/rest/slurmrestd.sock
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
STATE=${SLURM_STATE:-/run/hud-slurm}
N=${SLURM_NODES:-3}
BR=br-slurm
NET=10.215.0
GUARD=$HERE/guard.sh
# shellcheck source=_nodes.sh
. "$HERE/_nodes.sh"
[ "$(id -u)" = 0 ] || { log "must run as root"; exit 1; }

missing=()
for p in slurmctld slurmd slurm-client slurmrestd slurm-wlm-jwt-plugin munge iptables; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  [ "${INSTALL:-1}" = 1 ] || { log "missing packages: ${missing[*]}"; exit 1; }
  log "installing ${missing[*]}"
  # Maintainer scripts must not start daemons (before the guard, and with Debian's config).
  prc=0
  [ -e /usr/sbin/policy-rc.d ] || {
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    prc=1
  }
  [ -f /var/lib/apt/lists/deb.debian.org_debian_dists_bookworm_InRelease ] || timeout 300 apt-get update -qq
  DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq --no-install-recommends \
    -o DPkg::Lock::Timeout=600 "${missing[@]}" >/dev/null
  [ $prc = 1 ] && rm -f /usr/sbin/policy-rc.d
fi

mkdir -p "$STATE"
chmod 755 "$STATE"
bridge_up "$GUARD" $BR $NET.254
node_up slurm-ctl $BR $NET.10
for i in $(seq 1 "$N"); do node_up "slurm-n$i" $BR "$NET.1$i"; done

# munged, as the munge user, with a key of this cluster's own; its socket is for everyone (0755).
M=$STATE/munge
if [ ! -S "$M/munge.socket" ] || ! munge -n -S "$M/munge.socket" >/dev/null 2>&1; then
  mkdir -p "$M"
  chown munge:munge "$M"
  chmod 755 "$M"
  if [ ! -s "$M/munge.key" ]; then
    (umask 077 && dd if=/dev/urandom of="$M/munge.key" bs=1024 count=1 status=none)
    chown munge:munge "$M/munge.key"
    chmod 400 "$M/munge.key"
  fi
  rm -f "$M/munge.socket" "$M/munge.socket.lock"
  start_bg munged setpriv --reuid=munge --regid=munge --init-groups munged -F --socket="$M/munge.socket" --key-file="$M/munge.key" \
    --log-file="$M/munged.log" --pid-file="$M/munged.pid" --seed-file="$M/munged.seed"
  wait_daemon munged 100 munge -n -S "$M/munge.socket" || { log "munged failed"; tail "$STATE/munged.log" "$M/munged.log"; exit 1; }
fi

# The JWT key (slurmctld reads it as SlurmUser) for slurmrestd's clients.
if [ ! -s "$STATE/jwt.key" ]; then
  (umask 077 && dd if=/dev/urandom of="$STATE/jwt.key" bs=32 count=1 status=none)
  chown slurm:slurm "$STATE/jwt.key"
  chmod 600 "$STATE/jwt.key"
fi
mkdir -p "$STATE/ctld" "$STATE/log"
chown slurm:slurm "$STATE/ctld" "$STATE/log"
chmod 700 "$STATE/ctld"
for i in $(seq 1 "$N"); do mkdir -p "$STATE/spool/slurm-n$i"; done
# Nodes declare 8 CPUs each whatever the machine has (config_overrides): the test packs tasks.
cat >"$STATE/slurm.conf" <<EOF
# written by slurm_up.sh
ClusterName=hud
SlurmctldHost=slurm-ctl($NET.10)
SlurmUser=slurm
AuthType=auth/munge
AuthInfo=socket=$M/munge.socket
CredType=cred/munge
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$STATE/jwt.key
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/slurmctld.pidfile
SlurmdPidFile=$STATE/spool/%n/slurmd.pidfile
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
SlurmctldPort=6817
SlurmdPort=6818
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
SlurmdTimeout=10
SlurmctldTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=5
UsePAM=0
MailProg=/bin/true
NodeName=slurm-n[1-$N] NodeAddr=$NET.[11-1$N] CPUs=8 RealMemory=2000 State=UNKNOWN
PartitionName=hud Nodes=slurm-n[1-$N] Default=YES MaxTime=INFINITE State=UP
EOF
chmod 644 "$STATE/slurm.conf"
export SLURM_CONF=$STATE/slurm.conf

# slurmctld, in its namespace; it drops to SlurmUser itself.
start_bg slurmctld nsenter --net=/run/netns/slurm-ctl unshare --uts sh -c \
  "hostname slurm-ctl; exec slurmctld -D -f $SLURM_CONF"
wait_daemon slurmctld 150 scontrol ping || { log "slurmctld failed"; tail "$STATE/slurmctld.log" "$STATE/log/slurmctld.log"; exit 1; }
for i in $(seq 1 "$N"); do
  ns=slurm-n$i
  start_bg "slurmd-$ns" nsenter --net=/run/netns/$ns unshare --uts sh -c \
    "hostname $ns; exec slurmd -D -N $ns -f $SLURM_CONF"
done
ready() { [ "$(sinfo -h -N -o '%N %t' | awk '$2 == "idle" || $2 == "mix" || $2 == "alloc"' | wc -l)" -ge "$N" ]; }
wait_for 300 ready || { log "nodes not idle"; sinfo -N; tail "$STATE"/log/slurmd-*.log; exit 1; }

# slurmrestd runs as nobody (it refuses root and SlurmUser), its socket in a directory of nobody's.
if ! { [ -S "$STATE/rest/slurmrestd.sock" ] && kill -0 "$(cat "$STATE/slurmrestd.pid" 2>/dev/null)" 2>/dev/null; }; then
  mkdir -p "$STATE/rest"
  chown nobody "$STATE/rest"
  rm -f "$STATE/rest/slurmrestd.sock"
  start_bg slurmrestd env SLURM_JWT=daemon SLURM_CONF="$SLURM_CONF" slurmrestd -a rest_auth/jwt \
    -s openapi/v0.0.38 -u nobody "unix:$STATE/rest/slurmrestd.sock"
  wait_daemon slurmrestd 100 test -S "$STATE/rest/slurmrestd.sock" || { log "slurmrestd failed"; tail "$STATE/slurmrestd.log"; exit 1; }
fi
log "slurm of $N nodes up: SLURM_CONF=$SLURM_CONF, slurmrestd unix:$STATE/rest/slurmrestd.sock"
