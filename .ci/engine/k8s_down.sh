#!/bin/bash
# Tears down k8s_up.sh: the kubelets, then what each node's containerd runs (pods' containers and
# sandboxes), the containerds, their shims, whatever still runs in the nodes' and pods' namespaces,
# the control plane and etcd (all by recorded PID), the mounts under the state, the pods' cgroups,
# the namespaces, veths, bridge, routes and rules, the guard if the clusters added it, and the
# state. Safe to run twice or after a partial start. The cache (k8s_build.sh) stays.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
STATE=${K8S_STATE:-/var/lib/hud-k8s}
GUARD=$HERE/guard.sh
# shellcheck source=_nodes.sh
. "$HERE/_nodes.sh"
nodes=$({
  for f in "$STATE"/containerd-k8s-n*.pid "$STATE"/kubelet-k8s-n*.pid; do
    [ -e "$f" ] && basename "$f" .pid | sed -E 's/^(containerd|kubelet)-//'
  done
  ip netns list | awk '/^k8s-n[0-9]+( |$)/{print $1}'
  for d in /run/hud-k8s/k8s-n*; do [ -d "$d" ] && basename "$d"; done
} | sort -u)
for ns in $nodes; do stop_pid "$STATE/kubelet-$ns.pid"; done
for ns in $nodes; do
  sock=/run/hud-k8s/$ns/containerd.sock
  c="ctr -a $sock -n k8s.io"
  if [ -S "$sock" ] && timeout 10 ctr -a "$sock" version >/dev/null 2>&1; then
    for t in $($c tasks ls -q 2>/dev/null); do timeout 20 $c tasks kill -a -s SIGKILL "$t" >/dev/null 2>&1; done
    for t in $($c tasks ls -q 2>/dev/null); do
      for _ in $(seq 50); do timeout 20 $c tasks delete "$t" >/dev/null 2>&1 && break; sleep 0.1; done
    done
    $c containers ls -q 2>/dev/null | xargs -r timeout 60 $c containers rm >/dev/null 2>&1
  fi
  stop_pid "$STATE/containerd-$ns.pid"
done
# Shims (and the containers under them) of our containerds, also of a run whose state is gone.
for p in $(pgrep -f 'containerd-shim-runc-v2 .*-address /run/hud-k8s/' 2>/dev/null); do
  addr=$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | sed -E 's/.*-address ([^ ]+).*/\1/')
  id=$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | sed -E 's/.*-id ([^ ]+).*/\1/')
  for c in $(cat /proc/"$p"/task/*/children 2>/dev/null); do kill -KILL "$c" 2>/dev/null; done
  kill -KILL "$p" 2>/dev/null
  # Its socket, named as containerd names it (sha256 of address/namespace/id under /run/containerd/s).
  [ -n "$addr" ] && [ -n "$id" ] &&
    rm -f "/run/containerd/s/$(printf '%s' "$addr/k8s.io/$id" | sha256sum | cut -d' ' -f1)"
done
# Containers whose shim is gone run on in the pods' namespaces: end them by PID.
for f in /run/hud-k8s/k8s-n*/containerd/io.containerd.grpc.v1.cri/netns/*; do
  [ -e "$f" ] || continue
  ino=$(stat -L -c %i "$f" 2>/dev/null) || continue
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/ns/net" 2>/dev/null)" = "net:[$ino]" ] && kill -KILL "${p#/proc/}" 2>/dev/null
  done
done
for n in kube-scheduler kube-controller-manager kube-apiserver etcd; do stop_pid "$STATE/$n.pid"; done
for ns in $nodes; do node_down "$ns"; done
for l in $(ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E '^k8s-n[0-9]+-h$'); do
  ip link del "$l" 2>/dev/null
done
umount_under /run/hud-k8s "$STATE"
# The pods' cgroups (empty once their processes are gone), deepest first.
for c in /sys/fs/cgroup/*/hud-k8s; do
  [ -d "$c" ] || continue
  for _ in 1 2 3 4 5; do
    find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null
    [ -d "$c" ] || break
    sleep 0.5
  done
  [ -d "$c" ] && echo "warn: cgroup $c not removed"
done
bridge_down "$GUARD" br-k8s
if [ -f "$STATE/orig_sysctl" ]; then
  while IFS= read -r kv; do sysctl -qw "$kv" 2>/dev/null; done <"$STATE/orig_sysctl"
fi
if [ -f "$STATE/made_dirs" ]; then
  while IFS= read -r d; do
    case "$d" in /var/log/pods | /var/log/containers | /var/lib/cni) rm -rf "$d" ;; esac
  done <"$STATE/made_dirs"
fi
rm -rf /run/hud-k8s "$STATE"
exit 0
