#!/bin/bash
# A 3-node Kubernetes 1.20 cluster on this machine (root), from the binaries k8s_build.sh caches:
# etcd (Debian's etcd-server, on 127.0.0.1) and kube-apiserver (on the bridge address only),
# kube-controller-manager and kube-scheduler on the host; network namespaces k8s-n1..N on the
# bridge br-k8s (10.214.0.0/24, host side .254), each with its own containerd (Debian's, with a
# runc wrapper that sets no OOM score) and kubelet (started with nsenter). Pods get 10.244.N.0/24
# on node N (CNI bridge + host-local); the host and the nodes route to every node's pods, nothing
# else (the nodes have no default route). No kube-proxy, no cluster DNS. Behind the firewall
# guard, which goes in before any daemon starts. Idempotent (a second run restarts what is gone,
# such as a killed node). State under $K8S_STATE (certificates, etcd, node data, logs, PIDs), for
# k8s_down.sh. Clients: $K8S_STATE/admin.kubeconfig (client certificate, system:masters).
#   K8S_NODES=3  K8S_STATE=/var/lib/hud-k8s  K8S_CACHE=/var/cache/hud-sdk/k8s  INSTALL=1
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
STATE=${K8S_STATE:-/var/lib/hud-k8s}
CACHE=${K8S_CACHE:-/var/cache/hud-sdk/k8s}/v1.20.2
N=${K8S_NODES:-3}
BR=br-k8s
NET=10.214.0
API=$NET.254
PODS=10.244
GUARD=$HERE/guard.sh
# shellcheck source=_nodes.sh
. "$HERE/_nodes.sh"
[ "$(id -u)" = 0 ] || { log "must run as root"; exit 1; }
BIN=$CACHE/bin
for b in kube-apiserver kube-controller-manager kube-scheduler kubelet; do
  [ -x "$BIN/$b" ] || { log "missing $BIN/$b: run k8s_build.sh first"; exit 1; }
done

missing=()
for p in etcd-server containerd runc containernetworking-plugins iptables openssl curl; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  [ "${INSTALL:-1}" = 1 ] || { log "missing packages: ${missing[*]}"; exit 1; }
  log "installing ${missing[*]}"
  prc=0
  [ -e /usr/sbin/policy-rc.d ] || {
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    prc=1
  }
  [ -f /var/lib/apt/lists/deb.debian.org_debian_dists_bookworm_InRelease ] || timeout 300 apt-get update -qq
  DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq --no-install-recommends \
    -o DPkg::Lock::Timeout=600 "${missing[@]}" >/dev/null
  [ $prc = 1 ] && rm -f /usr/sbin/policy-rc.d
fi

mkdir -p "$STATE/pki" "$STATE/log"
chmod 700 "$STATE"
# What the kubelets change outside the state, recorded once so that k8s_down.sh puts it back: the
# kernel settings they set (protectKernelDefaults would refuse to start instead), and the shared
# directories they and the CNI plugins write to (/var/log/pods, /var/log/containers, /var/lib/cni).
if [ ! -f "$STATE/orig_sysctl" ]; then
  for k in vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops \
    kernel.keys.root_maxkeys kernel.keys.root_maxbytes; do
    echo "$k=$(sysctl -n "$k")"
  done >"$STATE/orig_sysctl"
  for d in /var/log/pods /var/log/containers /var/lib/cni; do
    [ -e "$d" ] || echo "$d"
  done >"$STATE/made_dirs"
fi
bridge_up "$GUARD" $BR $API
for i in $(seq 1 "$N"); do
  ns=k8s-n$i
  node_up "$ns" $BR "$NET.1$i"
  ip netns exec "$ns" sysctl -qw net.ipv4.ip_forward=1
  # The pods' bridge, made before the CNI plugin would make it, with an address of its own: a
  # bridge that takes its first port's address instead changes it under the first pod's ARP cache
  # (its replies then go nowhere until the entry expires).
  if ! ip -n "$ns" link show cni0 >/dev/null 2>&1; then
    ip -n "$ns" link add cni0 type bridge
    ip -n "$ns" link set cni0 address "02:00:0a:f4:$(printf %02x "$i"):01"
  fi
  ip -n "$ns" addr replace "$PODS.$i.1/24" dev cni0
  ip -n "$ns" link set cni0 up
  # Every other node's pods through that node (the host's routes are added below).
  for j in $(seq 1 "$N"); do
    [ "$j" = "$i" ] || ip -n "$ns" route replace "$PODS.$j.0/24" via "$NET.1$j" dev eth0
  done
  ip route replace "$PODS.$i.0/24" via "$NET.1$i" dev $BR
done

# Certificates: one CA; the API server's serving certificate; client certificates for the admin,
# the API server (to kubelets) and each node; the service-account signing key.
P=$STATE/pki
cert() { # name subject [san]  (client and server use; signed by the CA)
  local name=$1 subj=$2 san=${3:-}
  [ -s "$P/$name.crt" ] && return 0
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$P/$name.key" 2>/dev/null
  openssl req -new -key "$P/$name.key" -subj "$subj" -out "$P/$name.csr" 2>/dev/null
  {
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=serverAuth,clientAuth"
    [ -n "$san" ] && echo "subjectAltName=$san"
  } >"$P/$name.ext"
  openssl x509 -req -in "$P/$name.csr" -CA "$P/ca.crt" -CAkey "$P/ca.key" -CAcreateserial \
    -days 7 -extfile "$P/$name.ext" -out "$P/$name.crt" 2>/dev/null
  rm -f "$P/$name.csr" "$P/$name.ext"
}
(
  umask 077
  if [ ! -s "$P/ca.crt" ]; then
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$P/ca.key" 2>/dev/null
    openssl req -x509 -new -key "$P/ca.key" -subj "/CN=hud-k8s-ca" -days 7 -out "$P/ca.crt" 2>/dev/null
  fi
  cert apiserver "/CN=kube-apiserver" \
    "IP:$API,IP:127.0.0.1,IP:10.96.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  cert admin "/O=system:masters/CN=hud-admin"
  cert apiserver-kubelet "/O=system:masters/CN=kube-apiserver-kubelet-client"
  for i in $(seq 1 "$N"); do cert "node-k8s-n$i" "/O=system:nodes/CN=system:node:k8s-n$i"; done
  if [ ! -s "$P/sa.key" ]; then
    openssl genrsa -out "$P/sa.key" 2048 2>/dev/null
    openssl rsa -in "$P/sa.key" -pubout -out "$P/sa.pub" 2>/dev/null
  fi
)
chmod 644 "$P/ca.crt"
kubeconfig() { # file cert-name
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: hud
  cluster:
    server: https://$API:6443
    certificate-authority: $P/ca.crt
users:
- name: $2
  user:
    client-certificate: $P/$2.crt
    client-key: $P/$2.key
contexts:
- name: hud
  context:
    cluster: hud
    user: $2
    namespace: default
current-context: hud
EOF
  chmod 600 "$1"
}
kubeconfig "$STATE/admin.kubeconfig" admin
curl_api() { # path
  curl -sf --max-time 5 --cacert "$P/ca.crt" --cert "$P/admin.crt" --key "$P/admin.key" "https://$API:6443$1"
}

start_bg etcd etcd --name hud --data-dir "$STATE/etcd" \
  --listen-client-urls http://127.0.0.1:23790 --advertise-client-urls http://127.0.0.1:23790 \
  --listen-peer-urls http://127.0.0.1:23800 --initial-advertise-peer-urls http://127.0.0.1:23800 \
  --initial-cluster hud=http://127.0.0.1:23800 --listen-metrics-urls= --log-level warn
wait_daemon etcd 150 curl -sf --max-time 2 http://127.0.0.1:23790/health || {
  log "etcd failed"
  tail "$STATE/etcd.log"
  exit 1
}
start_bg kube-apiserver "$BIN/kube-apiserver" --etcd-servers=http://127.0.0.1:23790 \
  --bind-address=$API --advertise-address=$API --secure-port=6443 \
  --tls-cert-file="$P/apiserver.crt" --tls-private-key-file="$P/apiserver.key" \
  --client-ca-file="$P/ca.crt" --anonymous-auth=false \
  --kubelet-client-certificate="$P/apiserver-kubelet.crt" --kubelet-client-key="$P/apiserver-kubelet.key" \
  --kubelet-preferred-address-types=InternalIP \
  --service-account-key-file="$P/sa.pub" --service-account-signing-key-file="$P/sa.key" \
  --service-account-issuer=https://kubernetes.default.svc --api-audiences=https://kubernetes.default.svc \
  --service-cluster-ip-range=10.96.0.0/24 --authorization-mode=Node,RBAC \
  --enable-admission-plugins=NodeRestriction --profiling=false --v=1
wait_daemon kube-apiserver 300 curl_api /readyz || {
  log "kube-apiserver failed"
  tail "$STATE/kube-apiserver.log"
  exit 1
}
# The controllers and the scheduler: admin credentials, loopback only, no insecure port.
start_bg kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig="$STATE/admin.kubeconfig" \
  --bind-address=127.0.0.1 --port=0 --secure-port=0 --leader-elect=false \
  --service-account-private-key-file="$P/sa.key" --root-ca-file="$P/ca.crt" \
  --use-service-account-credentials=false --controllers='*,-nodeipam,-cloud-node-lifecycle' \
  --node-monitor-period=2s --node-monitor-grace-period=16s --pod-eviction-timeout=30s \
  --profiling=false --v=1
start_bg kube-scheduler "$BIN/kube-scheduler" --kubeconfig="$STATE/admin.kubeconfig" \
  --bind-address=127.0.0.1 --port=0 --secure-port=0 --leader-elect=false --profiling=false --v=1

# The nodes: containerd and kubelet in each namespace.
for i in $(seq 1 "$N"); do
  ns=k8s-n$i
  d=$STATE/$ns
  r=/run/hud-k8s/$ns
  mkdir -p "$d/cni" "$d/containerd" "$d/kubelet" "$r"
  cat >"$d/cni/10-hud.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "hud-k8s", "plugins": [{"type": "bridge", "bridge": "cni0",
 "isGateway": true, "ipMasq": false, "ipam": {"type": "host-local", "dataDir": "$d/ipam",
 "ranges": [[{"subnet": "$PODS.$i.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}}]}
EOF
  cat >"$d/containerd.toml" <<EOF
version = 2
root = "$d/containerd"
state = "$r/containerd"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "$r/containerd.sock"
[ttrpc]
  address = "$r/containerd.ttrpc.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$(cat "$CACHE/pause.ref")"
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$HERE/k8s_runc.sh"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$d/cni"
EOF
  start_bg "containerd-$ns" nsenter --net=/run/netns/$ns containerd --config "$d/containerd.toml"
done
for i in $(seq 1 "$N"); do
  ns=k8s-n$i
  r=/run/hud-k8s/$ns
  wait_daemon "containerd-$ns" 300 ctr -a "$r/containerd.sock" version || {
    log "containerd on $ns failed"
    tail "$STATE/containerd-$ns.log"
    exit 1
  }
  ref=$(cat "$CACHE/pause.ref")
  ctr -a "$r/containerd.sock" -n k8s.io images ls -q | grep -qx "$ref" ||
    ctr -a "$r/containerd.sock" -n k8s.io images import --all-platforms "$CACHE/pause.tar" >/dev/null
done
for i in $(seq 1 "$N"); do
  ns=k8s-n$i
  d=$STATE/$ns
  r=/run/hud-k8s/$ns
  kubeconfig "$d/kubelet.kubeconfig" "node-$ns"
  # Pods go in cgroups under /hud-k8s/NODE (kubelet wants the root to exist; cpuset needs values).
  for c in /sys/fs/cgroup/*/; do
    [ -d "$c" ] || continue
    case "$c" in */unified/) continue ;; esac
    mkdir -p "$c/hud-k8s/$ns"
    if [ -f "$c/cpuset.cpus" ]; then
      cat "$c/cpuset.cpus" >"$c/hud-k8s/cpuset.cpus"
      cat "$c/cpuset.mems" >"$c/hud-k8s/cpuset.mems"
      cat "$c/cpuset.cpus" >"$c/hud-k8s/$ns/cpuset.cpus"
      cat "$c/cpuset.mems" >"$c/hud-k8s/$ns/cpuset.mems"
    fi
  done
  cat >"$d/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NET.1$i
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $P/ca.crt}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
cgroupRoot: /hud-k8s/$ns
cgroupsPerQOS: true
enforceNodeAllocatable: []
failSwapOn: false
oomScoreAdj: 0
nodeStatusUpdateFrequency: 2s
nodeStatusReportFrequency: 10s
syncFrequency: 10s
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%"}
resolvConf: ""
podPidsLimit: -1
maxPods: 110
rotateCertificates: false
serverTLSBootstrap: false
EOF
  # The in-tree AWS credential provider probes 169.254.169.254 unless told not to.
  start_bg "kubelet-$ns" nsenter --net=/run/netns/$ns env AWS_EC2_METADATA_DISABLED=true \
    "$BIN/kubelet" --config="$d/kubelet.yaml" --kubeconfig="$d/kubelet.kubeconfig" \
    --container-runtime=remote --container-runtime-endpoint="unix://$r/containerd.sock" \
    --runtime-request-timeout=2m --hostname-override=$ns --node-ip="$NET.1$i" \
    --root-dir="$d/kubelet" --cert-dir="$d/kubelet/pki" --v=1
done
nodes_ready() {
  [ "$(curl_api /api/v1/nodes | jq '[.items[] | select(.status.conditions[]? |
    select(.type == "Ready" and .status == "True"))] | length')" -ge "$N" ]
}
wait_for 600 nodes_ready || {
  log "nodes not ready"
  curl_api /api/v1/nodes | jq -c '.items[] | [.metadata.name, [.status.conditions[]? | select(.type == "Ready")]]'
  tail -5 "$STATE"/kubelet-*.log
  exit 1
}
# Pods are refused until the namespace's service account exists (the ServiceAccount admission).
wait_for 300 curl_api /api/v1/namespaces/default/serviceaccounts/default || {
  log "no default service account"
  tail "$STATE/kube-controller-manager.log"
  exit 1
}
log "kubernetes of $N nodes up: KUBECONFIG=$STATE/admin.kubeconfig"
