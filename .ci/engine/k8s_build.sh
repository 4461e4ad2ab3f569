#!/bin/bash
# Builds the Kubernetes server components the k8s test cluster runs (k8s_up.sh) and caches them
# outside the clone: kube-apiserver, kube-controller-manager, kube-scheduler and kubelet 1.20.2 from
# Debian 12's `kubernetes` source package (CGO_ENABLED=0, about 7 minutes on two idle cores), and a
# pause image (a static Go program in an OCI archive, since no registry can be pulled from).
# Installs what it needs (golang-go, rsync, dpkg-dev). Idempotent: a complete cache is kept.
#   Usage: k8s_build.sh [--check] [CACHE_DIR]   (default /var/cache/hud-sdk/k8s; --check only says
#   whether the cache is complete, by its exit status)
# The source comes through a private apt configuration with a deb-src entry (the machine's own
# sources list binary packages only, and stay as they are).
set -euo pipefail
CHECK=0
if [ "${1:-}" = --check ]; then
  CHECK=1
  shift
fi
CACHE=${1:-/var/cache/hud-sdk/k8s}
VERSION=v1.20.2
OUT=$CACHE/$VERSION
BINS="kube-apiserver kube-controller-manager kube-scheduler kubelet"
# Changes with how the binaries are made, so that a cache made otherwise is built again.
RECIPE="reflect2-1.0.2 providerless"
log() { echo "[k8s_build $(date +%T)] $*" >&2; }

complete() {
  local b
  for b in $BINS; do [ -x "$OUT/bin/$b" ] || return 1; done
  [ -s "$OUT/pause.tar" ] && [ -s "$OUT/pause.ref" ] || return 1
  [ "$(cat "$OUT/recipe" 2>/dev/null)" = "$RECIPE" ] || return 1
  "$OUT/bin/kubelet" --version 2>/dev/null | grep -qx "Kubernetes $VERSION"
}
if complete; then
  log "cached: $OUT"
  exit 0
fi
[ $CHECK = 0 ] || exit 1
[ "$(id -u)" = 0 ] || { log "must run as root (apt-get)"; exit 1; }

missing=()
for p in golang-go rsync dpkg-dev golang-github-modern-go-reflect2-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  [ -f /var/lib/apt/lists/deb.debian.org_debian_dists_bookworm_InRelease ] || timeout 300 apt-get update -qq
  DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq --no-install-recommends \
    -o DPkg::Lock::Timeout=600 "${missing[@]}" >/dev/null
fi

WORK=$CACHE/build
rm -rf "$WORK"
mkdir -p "$WORK/apt/lists/partial" "$WORK/apt/cache/archives/partial"
trap 'rm -rf "$WORK"' EXIT
cat >"$WORK/apt/sources.list" <<EOF
deb-src http://deb.debian.org/debian bookworm main
deb-src http://deb.debian.org/debian-security bookworm-security main
deb-src http://deb.debian.org/debian bookworm-updates main
EOF
APT=(-o "Dir::Etc::SourceList=$WORK/apt/sources.list" -o Dir::Etc::SourceParts=-
  -o "Dir::State::Lists=$WORK/apt/lists" -o "Dir::Cache=$WORK/apt/cache" -o Debug::NoLocking=1
  -o APT::Sandbox::User=root)
log "fetching the kubernetes source package"
(cd "$WORK" && timeout 300 apt-get "${APT[@]}" update -qq &&
  timeout 600 apt-get "${APT[@]}" source --download-only -qq kubernetes) >"$WORK/fetch.log" 2>&1 ||
  { tail -5 "$WORK/fetch.log"; exit 1; }
dsc=$(ls "$WORK"/kubernetes_*.dsc)
case "$dsc" in *really1.20.2*) ;; *) log "unexpected source package: $dsc"; exit 1 ;; esac
dpkg-source -x --no-check "$dsc" "$WORK/src" >/dev/null

cd "$WORK/src"
# The vendored reflect2 1.0.1 (under json-iterator) breaks with Go 1.18 and later: kube-apiserver
# dies within a minute ("fatal error: fault" in UnsafeMapType.UnsafeIterate). Debian packages the
# fixed 1.0.2; the tree is built in GOPATH mode, so its vendor directory is what counts.
R=/usr/share/gocode/src/github.com/modern-go/reflect2
[ -f "$R/go_above_118.go" ] || { log "missing $R (golang-github-modern-go-reflect2-dev)"; exit 1; }
rm -rf vendor/github.com/modern-go/reflect2
cp -r "$R" vendor/github.com/modern-go/reflect2
sed -i 's#^\(\# github.com/modern-go/reflect2\) v1.0.1#\1 v1.0.2#; s#^\(\s*github.com/modern-go/reflect2\) v1.0.1#\1 v1.0.2#' \
  vendor/modules.txt go.mod
# No git here: the version comes from a file (hack/lib/version.sh).
cat >"$WORK/version.env" <<EOF
KUBE_GIT_VERSION='$VERSION'
KUBE_GIT_MAJOR='1'
KUBE_GIT_MINOR='20'
KUBE_GIT_TREE_STATE='archive'
EOF
# As Debian's rules build it (a GOPATH that holds the tree).
mkdir -p .go/src/k8s.io
ln -sfn ../../.. .go/src/k8s.io/kubernetes
log "building $BINS (several minutes)"
start=$(date +%s)
# providerless: without the in-tree cloud providers (their SDKs are most of the compile time).
env HOME="$WORK/home" GOPATH="$WORK/src/.go" GOCACHE="${K8S_GOCACHE:-$WORK/gocache}" CGO_ENABLED=0 \
  KUBE_GIT_VERSION_FILE="$WORK/version.env" GOFLAGS=-tags=providerless \
  nice -n 10 make WHAT="cmd/kube-apiserver cmd/kube-controller-manager cmd/kube-scheduler cmd/kubelet" \
  >"$WORK/make.log" 2>&1 || { tail -30 "$WORK/make.log"; exit 1; }
log "built in $(($(date +%s) - start)) s"

# The pause container: sleeps until told to stop (as the upstream pause does).
mkdir -p "$WORK/pause"
cat >"$WORK/pause/main.go" <<'EOF'
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGINT, syscall.SIGTERM)
	<-c
}
EOF
(cd "$WORK/pause" && env HOME="$WORK/home" GOCACHE="${K8S_GOCACHE:-$WORK/gocache}" GO111MODULE=off CGO_ENABLED=0 \
  go build -ldflags "-s -w" -o pause main.go)

# An OCI image archive by hand: one layer (/pause), a config, a manifest, an index.
img=$WORK/image
mkdir -p "$img/blobs/sha256" "$WORK/rootfs"
cp "$WORK/pause/pause" "$WORK/rootfs/pause"
tar --numeric-owner --owner=0 --group=0 --mtime=@0 -C "$WORK/rootfs" -cf "$WORK/layer.tar" pause
layer=$(sha256sum "$WORK/layer.tar" | cut -d' ' -f1)
mv "$WORK/layer.tar" "$img/blobs/sha256/$layer"
printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":["/pause"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
  "$layer" >"$WORK/config.json"
config=$(sha256sum "$WORK/config.json" | cut -d' ' -f1)
csize=$(stat -c %s "$WORK/config.json")
mv "$WORK/config.json" "$img/blobs/sha256/$config"
lsize=$(stat -c %s "$img/blobs/sha256/$layer")
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
  "$config" "$csize" "$layer" "$lsize" >"$WORK/manifest.json"
manifest=$(sha256sum "$WORK/manifest.json" | cut -d' ' -f1)
msize=$(stat -c %s "$WORK/manifest.json")
mv "$WORK/manifest.json" "$img/blobs/sha256/$manifest"
ref=hud.local/pause:3.2
printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"3.2"}}]}' \
  "$manifest" "$msize" "$ref" >"$img/index.json"
echo '{"imageLayoutVersion":"1.0.0"}' >"$img/oci-layout"

rm -rf "$OUT.new"
mkdir -p "$OUT.new/bin"
for b in $BINS; do cp "_output/bin/$b" "$OUT.new/bin/$b"; done
tar --numeric-owner --owner=0 --group=0 -C "$img" -cf "$OUT.new/pause.tar" .
echo "$ref" >"$OUT.new/pause.ref"
echo "$RECIPE" >"$OUT.new/recipe"
rm -rf "$OUT"
mv "$OUT.new" "$OUT"
complete || { log "the cache is incomplete after the build"; exit 1; }
log "cached: $OUT ($(du -sh "$OUT" | cut -f1))"
