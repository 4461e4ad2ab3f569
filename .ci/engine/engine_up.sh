#!/bin/bash
# Bring up container engines on a systemd-less Debian 12 box (root). Idempotent.
#   ENGINES="docker podman"  (default: docker)      SWARM=1 -> also 3-node swarm in netns (swarm_up.sh)
#   INSTALL=1 (default) apt-installs missing pkgs    BUILD_IMAGES=1 (default) builds hud-base:local
#   REGISTRY=1 installs docker-registry (for tests/engines/swarm_test.ts) without starting a swarm
#   ENGINE_STATE=/tmp/hud-engine  (PIDs, logs, saved sysctl/policy)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
STATE=${ENGINE_STATE:-/tmp/hud-engine}; mkdir -p "$STATE"
ENGINES=${ENGINES:-docker}
log() { echo "[engine_up $(date +%T)] $*" >&2; }
want() { [[ " $ENGINES " == *" $1 "* ]]; }
apt_install() {
  local missing=() p
  for p in "$@"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  [ "${INSTALL:-1}" = 1 ] || { log "missing packages: ${missing[*]}"; exit 1; }
  # never let maintainer scripts start daemons before the firewall guard is in place
  local prc=0; [ -e /usr/sbin/policy-rc.d ] || { printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; prc=1; }
  [ -f /var/lib/apt/lists/deb.debian.org_debian_dists_bookworm_InRelease ] || apt-get update -qq
  DEBIAN_FRONTEND=noninteractive nice -n 15 apt-get install -y -qq -o DPkg::Lock::Timeout=600 "${missing[@]}" >"$STATE/apt.log" 2>&1 \
    || { tail -20 "$STATE/apt.log"; exit 1; }
  [ $prc = 1 ] && rm -f /usr/sbin/policy-rc.d
  return 0
}
start_bg() { # name cmd...   (records PID in $STATE/name.pid, log in $STATE/name.log)
  local n=$1; shift
  if [ -f "$STATE/$n.pid" ] && kill -0 "$(cat "$STATE/$n.pid")" 2>/dev/null; then return 0; fi
  nohup "$@" >"$STATE/$n.log" 2>&1 &
  echo $! >"$STATE/$n.pid"
}
wait_for() { # tries cmd...  (0.2 s steps)
  local n=$1; shift; local i
  for i in $(seq "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done; return 1
}
[ "$(id -u)" = 0 ] || { log "must run as root"; exit 1; }
apt_install iptables curl
# record pre-existing state once, so engine_down.sh can restore it
[ -f "$STATE/orig_ip_forward" ] || cat /proc/sys/net/ipv4/ip_forward >"$STATE/orig_ip_forward"
[ -f "$STATE/orig_forward_policy" ] || iptables -w -S FORWARD | awk '$1=="-P"{print $3}' >"$STATE/orig_forward_policy"
# The guard, shared with the swarm and the clusters: the last user to go removes it.
"$HERE/guard.sh" acquire "engine$(echo "$STATE" | tr -c 'A-Za-z0-9_.\n-' _)" "path $STATE"
pk=(); want docker && pk+=(docker.io containerd)
want podman && pk+=(podman runc buildah netavark aardvark-dns)
# the swarm test distributes its image through Debian's registry (save|load without it)
{ [ "${SWARM:-0}" = 1 ] || [ "${REGISTRY:-0}" = 1 ]; } && pk+=(docker-registry)
apt_install "${pk[@]}"

if want docker; then
  if ! docker version >/dev/null 2>&1; then
    if ! ctr version >/dev/null 2>&1; then
      start_bg containerd containerd
      wait_for 300 ctr version || { log "containerd failed"; tail "$STATE/containerd.log"; exit 1; }
    fi
    rm -f /var/run/docker.pid   # stale pidfile from a killed run blocks startup
    start_bg dockerd dockerd --containerd /run/containerd/containerd.sock --insecure-registry 10.213.0.0/24
    wait_for 600 docker version || { log "dockerd failed"; tail "$STATE/dockerd.log"; exit 1; }
  fi
  log "docker: $(docker version -f '{{.Server.Version}} api {{.Server.APIVersion}}')"
fi
if want podman; then
  # default ulimits (nofile 1048576) exceed this box's hard limit -> runc "error setting rlimit type 7"
  hn=$(ulimit -Hn); [ "$hn" = unlimited ] && hn=1048576; [ "$hn" -gt 1048576 ] && hn=1048576
  hu=$(ulimit -Hu); [ "$hu" = unlimited ] && hu=32768; [ "$hu" -gt 32768 ] && hu=32768
  mkdir -p /etc/containers
  cat > /etc/containers/containers.conf <<CONF
# written by engine_up.sh
[containers]
default_ulimits = ["nofile=$hn:$hn", "nproc=$hu:$hu"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"

[network]
network_backend = "netavark"
CONF
  mkdir -p /run/podman
  if ! curl -sf --unix-socket /run/podman/podman.sock http://d/_ping >/dev/null 2>&1; then
    start_bg podman podman system service --time=0 unix:///run/podman/podman.sock
    wait_for 300 curl -sf --unix-socket /run/podman/podman.sock http://d/_ping || { log "podman service failed"; tail "$STATE/podman.log"; exit 1; }
  fi
  log "podman: $(podman version -f '{{.Server.Version}}' 2>/dev/null || podman --version)"
fi
"$HERE/guard.sh" add   # re-put guard jumps in front of the daemons' own FORWARD rules

if [ "${BUILD_IMAGES:-1}" = 1 ]; then
  # The base image for "hud image --from" (FROM scratch, the host's bash, coreutils, bwrap... and
  # their libraries): "hud image base", from this checkout.
  cli="$HERE/../../cli.ts"
  want docker && { docker image inspect hud-base:local >/dev/null 2>&1 || deno run -A "$cli" image base --tag hud-base:local --socket /var/run/docker.sock >/dev/null; }
  want podman && { podman image exists localhost/hud-base:local || deno run -A "$cli" image base --tag hud-base:local --socket /run/podman/podman.sock >/dev/null; }
fi
if [ "${SWARM:-0}" = 1 ]; then
  SWARM_REGISTRY=${SWARM_REGISTRY:-1} "$HERE/swarm_up.sh"
fi
log "up. state in $STATE"
