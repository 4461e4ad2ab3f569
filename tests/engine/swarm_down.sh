#!/bin/bash
# Tear down swarm_up.sh: stop the per-namespace dockerds and the registry (by recorded PID), kill
# what they left running in containerd, remove the namespaces, veths, bridge, rules and data, then
# containerd and the guard if swarm_up.sh started them. Safe to run twice or after a partial start.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
STATE=${ENGINE_STATE:-/tmp/hud-engine}
stop_pid() { # pidfile
  local f=$1 p; [ -f "$f" ] || return 0; p=$(cat "$f")
  if kill -0 "$p" 2>/dev/null; then
    kill -TERM "$p"; for t in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$p" 2>/dev/null && kill -KILL "$p"
  fi
  rm -f "$f"
}
ctr_ns_rm() { # kill and delete what a containerd namespace holds, then the namespace
  local n=$1 t; ctr namespaces ls -q 2>/dev/null | grep -qx "$n" || return 0
  for t in $(ctr -n "$n" tasks ls -q 2>/dev/null); do
    ctr -n "$n" tasks kill -s SIGKILL "$t" >/dev/null 2>&1
  done
  for t in $(ctr -n "$n" tasks ls -q 2>/dev/null); do
    for _ in $(seq 50); do ctr -n "$n" tasks delete "$t" >/dev/null 2>&1 && break; sleep 0.1; done
  done
  ctr -n "$n" containers ls -q 2>/dev/null | xargs -r ctr -n "$n" containers rm >/dev/null 2>&1
  ctr -n "$n" leases ls -q 2>/dev/null | xargs -r ctr -n "$n" leases rm >/dev/null 2>&1
  ctr -n "$n" images ls -q 2>/dev/null | xargs -r ctr -n "$n" images rm >/dev/null 2>&1
  ctr -n "$n" content ls -q 2>/dev/null | xargs -r ctr -n "$n" content rm >/dev/null 2>&1
  ctr -n "$n" snapshots ls 2>/dev/null | awk 'NR>1{print $1}' | tac | xargs -r ctr -n "$n" snapshots rm >/dev/null 2>&1
  ctr namespaces rm "$n" >/dev/null 2>&1 || echo "warn: containerd namespace $n not removed"
}
stop_pid "$STATE/registry.pid"
for pf in "$STATE"/dockerd-sw*.pid; do
  [ -e "$pf" ] || continue
  ns=$(basename "$pf" .pid); ns=${ns#dockerd-}
  stop_pid "$pf"
  ctr_ns_rm "$ns"; ctr_ns_rm "$ns-plugins"
  # A killed dockerd leaves its mounts, the data root itself among them.
  for m in $(awk -v r="/run/docker-$ns" -v d="/var/lib/docker-$ns" \
    '$2 == r || $2 == d || index($2, r "/") == 1 || index($2, d "/") == 1 {print $2}' /proc/mounts | sort -r); do
    umount -l "$m" 2>/dev/null
  done
  rm -rf "/var/lib/docker-$ns" "/run/docker-$ns" "/run/docker-$ns.sock" "/run/docker-$ns.pid"
  ip link del "$ns-h" 2>/dev/null
  ip netns del "$ns" 2>/dev/null
done
for ns in $(ip netns list | awk '/^sw[0-9]+/{print $1}'); do ip netns del "$ns"; done
for n in $(ctr namespaces ls -q 2>/dev/null | grep -E '^sw[0-9]+(-plugins)?$'); do ctr_ns_rm "$n"; done
ip link del brswarm 2>/dev/null
while iptables -w -D FORWARD -i brswarm -o brswarm -j ACCEPT 2>/dev/null; do :; done
rm -rf "$STATE/registry" "$STATE/registry.addr"
if [ -f "$STATE/containerd-swarm.pid" ]; then
  stop_pid "$STATE/containerd-swarm.pid"
fi
if [ -f "$STATE/swarm_guard_added" ]; then
  "$HERE/guard.sh" del; rm -f "$STATE/swarm_guard_added"
fi
exit 0
