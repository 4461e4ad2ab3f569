#!/bin/bash
# Tear down everything engine_up.sh started (by recorded PID), remove bridges/netns/iptables added.
# ENGINE_WIPE=1 also deletes /var/lib/docker, /var/lib/containers, /var/lib/containerd (fresh state). Packages stay.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
STATE=${ENGINE_STATE:-/tmp/hud-engine}
stop_pid() { # name [timeout_steps]
  local f="$STATE/$1.pid" p; [ -f "$f" ] || return 0; p=$(cat "$f")
  if kill -0 "$p" 2>/dev/null; then
    kill -TERM "$p"; for t in $(seq "${2:-150}"); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$p" 2>/dev/null && { echo "SIGKILL $1 ($p)"; kill -KILL "$p"; }
  fi
  rm -f "$f"
}
[ -x "$HERE/swarm_down.sh" ] && "$HERE/swarm_down.sh"
if [ -f "$STATE/podman.pid" ]; then
  podman rm -af -t 1 >/dev/null 2>&1; podman pod rm -af >/dev/null 2>&1
  stop_pid podman; rm -f /run/podman/podman.sock
fi
if [ -f "$STATE/dockerd.pid" ]; then
  docker ps -aq 2>/dev/null | xargs -r docker rm -f >/dev/null 2>&1
  stop_pid dockerd
fi
stop_pid containerd
# leftover shims (only ones belonging to containerd we started are children of it; they reparent to init on exit)
for p in $(pgrep -x containerd-shim-runc-v2 2>/dev/null); do
  tr '\0' ' ' </proc/$p/cmdline 2>/dev/null | grep -q -- "-address /run/containerd/containerd.sock" && kill -TERM "$p"
done
# bridges
for b in docker0 podman0 $(ip -o link show type bridge 2>/dev/null | awk -F': ' '{print $2}' | grep -E '^(br-[0-9a-f]{12}|podman[0-9]+)$'); do ip link del "$b" 2>/dev/null; done
# iptables rules/chains left by dockerd/netavark (only theirs)
for t in filter nat mangle; do
  iptables -w -t $t -S 2>/dev/null | grep -E '^-A' | grep -E -- '-j (DOCKER|NETAVARK)|docker0|podman[0-9]|^-A (DOCKER|NETAVARK)' | grep -vE '^-A (DOCKER|NETAVARK)' \
    | sed 's/^-A/-D/' | while read -r r; do eval iptables -w -t $t $r; done
  for c in $(iptables -w -t $t -S 2>/dev/null | awk '$1=="-N"{print $2}' | grep -E '^(DOCKER|NETAVARK)'); do iptables -w -t $t -F "$c"; done
  for c in $(iptables -w -t $t -S 2>/dev/null | awk '$1=="-N"{print $2}' | grep -E '^(DOCKER|NETAVARK)'); do iptables -w -t $t -X "$c"; done
done
[ -f "$STATE/orig_forward_policy" ] && iptables -w -P FORWARD "$(cat "$STATE/orig_forward_policy")" && rm -f "$STATE/orig_forward_policy"
[ -f "$STATE/orig_ip_forward" ] && cat "$STATE/orig_ip_forward" > /proc/sys/net/ipv4/ip_forward && rm -f "$STATE/orig_ip_forward"
# The guard goes with its last user (the swarm and the clusters use it too). Engines started before
# the guard had users were not registered: theirs goes when no one else uses it.
user="engine$(echo "$STATE" | tr -c 'A-Za-z0-9_.\n-' _)"
if [ -f "/run/hud-guard-users/$user" ]; then
  "$HERE/guard.sh" release "$user"
elif [ -z "$("$HERE/guard.sh" users)" ]; then
  "$HERE/guard.sh" del
fi
if [ "${ENGINE_WIPE:-0}" = 1 ]; then
  for m in $(awk '$2 ~ "^/(var/lib/(docker|containers|containerd)|run/(docker|containerd|containers))/" {print $2}' /proc/mounts | sort -r); do umount -l "$m"; done
  rm -rf /var/lib/docker /var/lib/containers/storage /var/lib/containerd /run/docker /run/containerd /run/containers /var/run/docker.sock /var/run/docker.pid
fi
exit 0
