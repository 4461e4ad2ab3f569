#!/bin/bash
# Tears down slurm_up.sh: slurmrestd, the slurmds, slurmctld and munged (by recorded PID), whatever
# still runs in the nodes' namespaces (job steps of a killed slurmd), the namespaces, veths, bridge
# and rules, the guard if the clusters added it, and the state. Safe to run twice or after a partial
# start.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
STATE=${SLURM_STATE:-/run/hud-slurm}
GUARD=$HERE/guard.sh
# shellcheck source=_nodes.sh
. "$HERE/_nodes.sh"
if [ -d "$STATE" ]; then
  stop_pid "$STATE/slurmrestd.pid"
  for f in "$STATE"/slurmd-*.pid; do [ -e "$f" ] && stop_pid "$f"; done
  stop_pid "$STATE/slurmctld.pid"
fi
for ns in $(ip netns list | awk '/^slurm-(n[0-9]+|ctl)( |$)/{print $1}'); do node_down "$ns"; done
for l in $(ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E '^slurm-(n[0-9]+|ctl)-h$'); do
  ip link del "$l" 2>/dev/null
done
[ -d "$STATE" ] && stop_pid "$STATE/munged.pid"
bridge_down "$GUARD" br-slurm
rm -rf "$STATE"
exit 0
