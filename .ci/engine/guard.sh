#!/bin/bash
# Safety firewall (idempotent). Usage: guard.sh add|del
# - packets FORWARDed from container/namespace subnets may only leave via engine bridges
#   (docker0, br-*, podman*, cni*, brswarm); anything else (eth0...) is dropped/rejected.
# - all OUTPUT to link-local 169.254.0.0/16 rejected.
# Lives in custom chains ENGINE-GUARD in mangle (never touched by docker/netavark) and filter.
set -u
ACTION=${1:-add}
SUBNETS="172.16.0.0/12 192.168.0.0/16 10.0.0.0/8"
ALLOWED_OUT="docker0 br-+ podman+ cni+ brswarm"
add_chain() { # table target
  local t=$1 tgt=$2
  iptables -w -t "$t" -N ENGINE-GUARD 2>/dev/null || iptables -w -t "$t" -F ENGINE-GUARD
  for o in $ALLOWED_OUT; do iptables -w -t "$t" -A ENGINE-GUARD -o "$o" -j RETURN; done
  for s in $SUBNETS; do iptables -w -t "$t" -A ENGINE-GUARD -s "$s" -j "$tgt"; done
  # (re)insert jump at position 1 so it precedes rules docker/netavark insert later
  while iptables -w -t "$t" -D FORWARD -j ENGINE-GUARD 2>/dev/null; do :; done
  iptables -w -t "$t" -I FORWARD 1 -j ENGINE-GUARD
}
del_chain() {
  local t=$1
  while iptables -w -t "$t" -D FORWARD -j ENGINE-GUARD 2>/dev/null; do :; done
  iptables -w -t "$t" -F ENGINE-GUARD 2>/dev/null; iptables -w -t "$t" -X ENGINE-GUARD 2>/dev/null
}
if [ "$ACTION" = add ]; then
  add_chain mangle DROP
  add_chain filter REJECT
  iptables -w -C OUTPUT -d 169.254.0.0/16 -j REJECT 2>/dev/null || iptables -w -I OUTPUT 1 -d 169.254.0.0/16 -j REJECT
  iptables -w -t mangle -C OUTPUT -d 169.254.0.0/16 -j DROP 2>/dev/null || iptables -w -t mangle -I OUTPUT 1 -d 169.254.0.0/16 -j DROP
  ip6tables -w -C FORWARD -j DROP 2>/dev/null || ip6tables -w -I FORWARD 1 -j DROP
else
  del_chain mangle; del_chain filter
  while iptables -w -D OUTPUT -d 169.254.0.0/16 -j REJECT 2>/dev/null; do :; done
  while iptables -w -t mangle -D OUTPUT -d 169.254.0.0/16 -j DROP 2>/dev/null; do :; done
  while ip6tables -w -D FORWARD -j DROP 2>/dev/null; do :; done
fi
