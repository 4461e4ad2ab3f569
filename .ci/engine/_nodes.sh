# Shared by k8s_up.sh/k8s_down.sh and slurm_up.sh/slurm_down.sh (sourced, not run): "nodes" as
# network namespaces on one bridge of their own, behind the firewall guard (guard.sh), and the
# bounded waits and PID-file stops the scripts use. Each caller sets STATE (its state directory).

log() { echo "[$(basename "$0" .sh) $(date +%T)] $*" >&2; }

wait_for() { # tries cmd...   (0.2 s steps, bounded)
  local n=$1 i
  shift
  for i in $(seq "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  return 1
}

# As wait_for, but gives up at once when the daemon recorded in $STATE/NAME.pid has exited.
wait_daemon() { # name tries cmd...
  local name=$1 n=$2 i
  shift 2
  for i in $(seq "$n"); do
    "$@" >/dev/null 2>&1 && return 0
    kill -0 "$(cat "$STATE/$name.pid" 2>/dev/null)" 2>/dev/null || return 1
    sleep 0.2
  done
  return 1
}

# Starts cmd... in the background with its log in $STATE/NAME.log and its PID in $STATE/NAME.pid,
# unless the recorded PID still runs. The command must exec the daemon (nsenter and `sh -c "exec"`
# do), so that the PID recorded is the daemon's.
start_bg() { # name cmd...
  local n=$1
  shift
  if [ -f "$STATE/$n.pid" ] && kill -0 "$(cat "$STATE/$n.pid")" 2>/dev/null; then return 0; fi
  nohup "$@" >"$STATE/$n.log" 2>&1 &
  echo $! >"$STATE/$n.pid"
}

stop_pid() { # pidfile   (TERM, up to 20 s, then KILL)
  local f=$1 p t
  [ -f "$f" ] || return 0
  p=$(cat "$f")
  if [ -n "$p" ] && kill -0 "$p" 2>/dev/null; then
    kill -TERM "$p"
    for t in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$p" 2>/dev/null && kill -KILL "$p"
  fi
  rm -f "$f"
}

# Adds the guard and the bridge BR with the host's address HOST_IP/24, accepting bridged traffic
# between its ports (dockerd sets the FORWARD policy to DROP and br_netfilter sends bridged frames
# through FORWARD). Each cluster is a user of the guard (guard.sh acquire, witnessed by its bridge,
# made first with no port and no address); the last user to go (cluster, swarm or engines)
# removes the guard, and only if a user added it.
bridge_up() { # guard.sh BR HOST_IP
  local guard=$1 br=$2 ip=$3
  ip link show "$br" >/dev/null 2>&1 || ip link add "$br" type bridge
  "$guard" acquire "$br" "link $br"
  ip addr replace "$ip/24" dev "$br"
  ip link set "$br" up
  iptables -w -C FORWARD -i "$br" -o "$br" -j ACCEPT 2>/dev/null ||
    iptables -w -I FORWARD 1 -i "$br" -o "$br" -j ACCEPT
  "$guard" add # keep the guard's jumps first
}

# A node: namespace NS with eth0 (IP/24) on BR, its host end NS-h; no default route, so that
# nothing in it reaches past the bridge, and link-local rejected inside it as on the host.
node_up() { # NS BR IP
  local ns=$1 br=$2 ip=$3
  if [ ! -e "/run/netns/$ns" ]; then
    ip netns add "$ns"
    # A host end left from an earlier run leads into another namespace: replace it.
    ip link del "$ns-h" 2>/dev/null || true
  fi
  if ! ip link show "$ns-h" >/dev/null 2>&1; then
    ip link add "$ns-h" type veth peer name eth0 netns "$ns"
    ip link set "$ns-h" master "$br" up
  fi
  ip -n "$ns" addr replace "$ip/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  ip netns exec "$ns" iptables -w -C OUTPUT -d 169.254.0.0/16 -j REJECT 2>/dev/null ||
    ip netns exec "$ns" iptables -w -I OUTPUT 1 -d 169.254.0.0/16 -j REJECT
}

# PIDs of the processes whose network namespace is NS (a node's daemons and what they ran).
ns_pids() { # NS
  local ino p
  [ -e "/run/netns/$1" ] || return 0
  ino=$(stat -L -c %i "/run/netns/$1" 2>/dev/null) || return 0
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/ns/net" 2>/dev/null)" = "net:[$ino]" ] && echo "${p#/proc/}"
  done
  return 0
}

node_down() { # NS   (kills what still runs in it, then removes it and its veth)
  local ns=$1 p
  for p in $(ns_pids "$ns"); do kill -KILL "$p" 2>/dev/null; done
  ip link del "$ns-h" 2>/dev/null
  ip netns del "$ns" 2>/dev/null
  return 0
}

bridge_down() { # guard.sh BR
  local guard=$1 br=$2
  ip link del "$br" 2>/dev/null
  while iptables -w -D FORWARD -i "$br" -o "$br" -j ACCEPT 2>/dev/null; do :; done
  "$guard" release "$br"
  return 0
}

# Unmounts (lazily, deepest first) everything mounted at or under each DIR.
umount_under() { # DIR...
  local d m
  for d in "$@"; do
    for m in $(awk -v r="$d" '$2 == r || index($2, r "/") == 1 {print $2}' /proc/mounts | sort -r); do
      umount -l "$m" 2>/dev/null
    done
  done
  return 0
}
