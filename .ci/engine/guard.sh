#!/bin/bash
# Safety firewall (idempotent). Usage: guard.sh add|del|acquire USER WITNESS|release USER|users
# - packets FORWARDed from container/namespace subnets may only leave via engine bridges
#   (docker0, br-*, podman*, cni*, brswarm) or a test's own namespace's veth (hudns*, with no
#   route on past it: tests/workspace/_netns_hosts.ts); anything else (eth0...) is dropped/rejected.
# - all OUTPUT to link-local 169.254.0.0/16 rejected.
# Lives in custom chains ENGINE-GUARD in mangle (never touched by docker/netavark) and filter.
# - acquire/release: the engines, the swarm and the clusters share one guard. Each registers as a
#   user in /run/hud-guard-users (a file USER holding its witness: "link BRIDGE" or "path DIR",
#   which exists while the user runs) and adds the guard; release unregisters, and the last user to
#   go removes the guard, only if a user added it (it was not there before the first registered).
#   Users whose witness is gone (a run killed before its teardown) no longer count.
set -u
ACTION=${1:-add}
# A test names a chain and registry of its own (GUARD_CHAIN, GUARD_USERS), so as not to touch the
# machine's guard.
CHAIN=${GUARD_CHAIN:-ENGINE-GUARD}
USERS=${GUARD_USERS:-/run/hud-guard-users}
SUBNETS="172.16.0.0/12 192.168.0.0/16 10.0.0.0/8"
ALLOWED_OUT="docker0 br-+ podman+ cni+ brswarm hudns+"
add_chain() { # table target
  local t=$1 tgt=$2
  iptables -w -t "$t" -N $CHAIN 2>/dev/null || iptables -w -t "$t" -F $CHAIN
  for o in $ALLOWED_OUT; do iptables -w -t "$t" -A $CHAIN -o "$o" -j RETURN; done
  for s in $SUBNETS; do iptables -w -t "$t" -A $CHAIN -s "$s" -j "$tgt"; done
  # (re)insert jump at position 1 so it precedes rules docker/netavark insert later
  while iptables -w -t "$t" -D FORWARD -j $CHAIN 2>/dev/null; do :; done
  iptables -w -t "$t" -I FORWARD 1 -j $CHAIN
}
del_chain() {
  local t=$1
  while iptables -w -t "$t" -D FORWARD -j $CHAIN 2>/dev/null; do :; done
  iptables -w -t "$t" -F $CHAIN 2>/dev/null; iptables -w -t "$t" -X $CHAIN 2>/dev/null
}
live_users() { # prints the registered users whose witness still exists; forgets the others
  local f kind what
  for f in "$USERS"/*; do
    [ -f "$f" ] || continue
    read -r kind what <"$f" || true
    case "$kind" in
    link) ip link show "$what" >/dev/null 2>&1 ;;
    path) [ -e "$what" ] ;;
    *) false ;;
    esac && { basename "$f"; continue; }
    rm -f "$f"
  done
}
if [ "$ACTION" = acquire ] || [ "$ACTION" = release ] || [ "$ACTION" = users ]; then
  USER_NAME=${2:-}
  [ "$ACTION" = users ] || [[ "$USER_NAME" =~ ^[A-Za-z0-9_.-]+$ ]] ||
    { echo "guard.sh $ACTION: a user name ([A-Za-z0-9_.-]+) is required" >&2; exit 2; }
  exec 9>"$USERS.lock"
  flock -w 60 9 || { echo "guard.sh: $USERS.lock is held" >&2; exit 1; }
  if [ "$ACTION" = users ]; then
    [ -d "$USERS" ] && live_users
    exit 0
  fi
  if [ "$ACTION" = acquire ]; then
    case "${3:-}" in
    link\ ?* | path\ ?*) ;;
    *) echo "guard.sh acquire: a witness (\"link BRIDGE\" or \"path DIR\") is required" >&2; exit 2 ;;
    esac
    mkdir -p "$USERS"
    if [ -z "$(live_users)" ]; then
      # The first user: the guard is ours to remove at the end unless it was there before.
      rm -f "$USERS/.added"
      iptables -w -S "$CHAIN" >/dev/null 2>&1 || touch "$USERS/.added"
    fi
    echo "$3" >"$USERS/$USER_NAME"
    exec 9>&-
    exec bash "$0" add
  fi
  rm -f "$USERS/$USER_NAME"
  [ -d "$USERS" ] || exit 0
  if [ -z "$(live_users)" ]; then
    [ -f "$USERS/.added" ] && bash "$0" del
    rm -rf "$USERS"
  fi
  exit 0
fi
# A test's chain leaves the rules outside the chains (link-local, IPv6) to the machine's guard.
case "$ACTION" in
add)
  add_chain mangle DROP
  add_chain filter REJECT
  [ "$CHAIN" = ENGINE-GUARD ] || exit 0
  iptables -w -C OUTPUT -d 169.254.0.0/16 -j REJECT 2>/dev/null || iptables -w -I OUTPUT 1 -d 169.254.0.0/16 -j REJECT
  iptables -w -t mangle -C OUTPUT -d 169.254.0.0/16 -j DROP 2>/dev/null || iptables -w -t mangle -I OUTPUT 1 -d 169.254.0.0/16 -j DROP
  ip6tables -w -C FORWARD -j DROP 2>/dev/null || ip6tables -w -I FORWARD 1 -j DROP
  ;;
del)
  del_chain mangle; del_chain filter
  [ "$CHAIN" = ENGINE-GUARD ] || exit 0
  while iptables -w -D OUTPUT -d 169.254.0.0/16 -j REJECT 2>/dev/null; do :; done
  while iptables -w -t mangle -D OUTPUT -d 169.254.0.0/16 -j DROP 2>/dev/null; do :; done
  while ip6tables -w -D FORWARD -j DROP 2>/dev/null; do :; done
  ;;
*)
  echo "usage: guard.sh add|del|acquire USER WITNESS|release USER|users" >&2
  exit 2
  ;;
esac
