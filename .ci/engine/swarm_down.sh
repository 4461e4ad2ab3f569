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
ns_pids() { # PIDs of the processes in the network namespaces a dockerd (exec root $1) made
  local f ino p
  for f in "$1"/netns/*; do
    [ -e "$f" ] || continue
    ino=$(stat -L -c %i "$f" 2>/dev/null) || continue
    for p in /proc/[0-9]*; do
      [ "$(readlink "$p/ns/net" 2>/dev/null)" = "net:[$ino]" ] && echo "${p#/proc/}"
    done
  done
}
stop_pid "$STATE/registry.pid"
# The nodes: those this state recorded, and any /run/docker-swN an earlier run left behind.
nodes=$({
  for pf in "$STATE"/dockerd-sw*.pid; do [ -e "$pf" ] && basename "$pf" .pid | sed 's/^dockerd-//'; done
  for d in /run/docker-sw[0-9]*; do [ -d "$d" ] && basename "$d" | sed 's/^docker-//'; done
} | sort -u)
for ns in $nodes; do
  stop_pid "$STATE/dockerd-$ns.pid"
  ctr_ns_rm "$ns"; ctr_ns_rm "$ns-plugins"
  # Containers whose shim is gone (containerd killed) run on, reparented to init: end them by PID.
  for p in $(ns_pids "/run/docker-$ns"); do kill -KILL "$p" 2>/dev/null; done
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
# Host ends of the veths, also of a run whose state is gone (a namespace kept alive by a container).
for l in $(ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E '^sw[0-9]+-h$'); do
  ip link del "$l" 2>/dev/null
done
for n in $(ctr namespaces ls -q 2>/dev/null | grep -E '^sw[0-9]+(-plugins)?$'); do ctr_ns_rm "$n"; done
ip link del brswarm 2>/dev/null
while iptables -w -D FORWARD -i brswarm -o brswarm -j ACCEPT 2>/dev/null; do :; done
rm -rf "$STATE/registry" "$STATE/registry.addr"
if [ -f "$STATE/containerd-swarm.pid" ]; then
  stop_pid "$STATE/containerd-swarm.pid"
fi
# The last user of the guard removes it (guard.sh release); a swarm started before the guard had
# users marked that it added the guard.
if [ -f "$STATE/swarm_guard_added" ] && [ -z "$("$HERE/guard.sh" users)" ]; then
  "$HERE/guard.sh" del
else
  "$HERE/guard.sh" release brswarm
fi
rm -f "$STATE/swarm_guard_added"
exit 0
