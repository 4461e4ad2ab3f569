#!/bin/bash
# A 3-"host" Docker swarm on this machine: network namespaces sw1..swN on the bridge brswarm
# (10.213.0.0/24, host side .254), one dockerd per namespace, sw1 the manager, and (SWARM_REGISTRY=1)
# Debian's docker-registry on 10.213.0.254:5000 to distribute images. Idempotent; root only.
# The firewall guard (guard.sh) goes in before any daemon starts. Everything started is recorded in
# $ENGINE_STATE (PIDs, what was added) so that swarm_down.sh removes exactly that, even after a failure.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
STATE=${ENGINE_STATE:-/tmp/hud-engine}; mkdir -p "$STATE"
N=${SWARM_NODES:-3}; BR=brswarm; NET=10.213.0
log() { echo "[swarm_up $(date +%T)] $*" >&2; }
wait_for() { # tries cmd...  (0.2 s steps, bounded)
  local n=$1; shift; local i
  for i in $(seq "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done; return 1
}
[ "$(id -u)" = 0 ] || { log "must run as root"; exit 1; }
for b in dockerd containerd ctr nsenter unshare iptables; do
  command -v $b >/dev/null || { log "missing $b: install docker.io containerd iptables util-linux"; exit 1; }
done
# The guard first, shared with the engines and the clusters (guard.sh acquire; the last user to go
# removes it), witnessed by the bridge, made first with no port and no address.
ip link show $BR >/dev/null 2>&1 || ip link add $BR type bridge
"$HERE/guard.sh" acquire $BR "link $BR"
if ! ctr version >/dev/null 2>&1; then
  nohup containerd >"$STATE/containerd-swarm.log" 2>&1 &
  echo $! >"$STATE/containerd-swarm.pid"
  wait_for 300 ctr version || { log "containerd failed"; tail "$STATE/containerd-swarm.log"; exit 1; }
fi
ip addr replace $NET.254/24 dev $BR; ip link set $BR up
# br_netfilter is built in (bridge-nf-call-iptables=1) and dockerd sets FORWARD policy DROP:
# bridged traffic between the namespaces must be explicitly accepted.
iptables -w -C FORWARD -i $BR -o $BR -j ACCEPT 2>/dev/null || iptables -w -I FORWARD 1 -i $BR -o $BR -j ACCEPT
"$HERE/guard.sh" add   # keep the guard's jump first
for i in $(seq 1 "$N"); do
  ns=sw$i
  if [ ! -e /run/netns/$ns ]; then
    ip netns add $ns
    # A host end left from an earlier run leads into another namespace: replace it.
    ip link del ${ns}-h 2>/dev/null || true
  fi
  if ! ip link show ${ns}-h >/dev/null 2>&1; then
    ip link add ${ns}-h type veth peer name eth0 netns $ns
    ip link set ${ns}-h master $BR up
  fi
  ip -n $ns addr replace $NET.1$i/24 dev eth0; ip -n $ns link set eth0 up; ip -n $ns link set lo up
  sock=/run/docker-$ns.sock
  if ! curl -sf --max-time 2 --unix-socket "$sock" http://d/_ping >/dev/null 2>&1; then
    mkdir -p /var/lib/docker-$ns /run/docker-$ns
    rm -f /run/docker-$ns.pid
    # nsenter --net (not `ip netns exec`, which remounts /sys and breaks dockerd); own UTS ns for a
    # distinct hostname; own containerd namespaces; the recorded PID is dockerd's (sh execs it).
    nohup nsenter --net=/run/netns/$ns unshare --uts sh -c "hostname $ns; exec dockerd \
      --data-root /var/lib/docker-$ns --exec-root /run/docker-$ns --pidfile /run/docker-$ns.pid \
      -H unix://$sock --containerd /run/containerd/containerd.sock \
      --containerd-namespace $ns --containerd-plugins-namespace $ns-plugins \
      --insecure-registry $NET.0/24 --bip 172.31.$i.1/24 --default-address-pool base=172.30.0.0/16,size=24" \
      >"$STATE/dockerd-$ns.log" 2>&1 &
    echo $! >"$STATE/dockerd-$ns.pid"
  fi
done
for i in $(seq 1 "$N"); do
  wait_for 600 curl -sf --max-time 2 --unix-socket /run/docker-sw$i.sock http://d/_ping ||
    { log "dockerd sw$i failed"; tail "$STATE/dockerd-sw$i.log"; exit 1; }
done
D1="docker -H unix:///run/docker-sw1.sock"
if [ "$($D1 info -f '{{.Swarm.LocalNodeState}}')" != active ]; then
  $D1 swarm init --advertise-addr $NET.11 --listen-addr $NET.11:2377 >/dev/null
fi
TOK=$($D1 swarm join-token -q worker)
for i in $(seq 2 "$N"); do
  Di="docker -H unix:///run/docker-sw$i.sock"
  [ "$($Di info -f '{{.Swarm.LocalNodeState}}')" = active ] ||
    $Di swarm join --advertise-addr $NET.1$i --listen-addr $NET.1$i:2377 --token "$TOK" $NET.11:2377 >/dev/null
done
wait_for 300 sh -c "[ \$($D1 node ls -q --filter role=worker | wc -l) -ge $((N - 1)) ]" ||
  { log "workers did not join"; $D1 node ls; exit 1; }
log "swarm of $N nodes up"
if [ "${SWARM_REGISTRY:-0}" = 1 ] && command -v docker-registry >/dev/null; then
  mkdir -p "$STATE/registry/data"
  cat >"$STATE/registry/config.yml" <<YML
version: 0.1
log: {level: warn}
storage: {filesystem: {rootdirectory: $STATE/registry/data}, delete: {enabled: true}}
http: {addr: "$NET.254:5000"}
YML
  if ! curl -sf --max-time 2 http://$NET.254:5000/v2/ >/dev/null; then
    nohup docker-registry serve "$STATE/registry/config.yml" >"$STATE/registry.log" 2>&1 &
    echo $! >"$STATE/registry.pid"
    wait_for 100 curl -sf --max-time 2 http://$NET.254:5000/v2/ || { log "registry failed"; tail "$STATE/registry.log"; exit 1; }
  fi
  log "registry: $NET.254:5000"
  echo "$NET.254:5000" >"$STATE/registry.addr"
fi
