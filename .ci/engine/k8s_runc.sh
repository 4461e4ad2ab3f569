#!/bin/sh
# runc for the k8s test cluster's containerd (k8s_up.sh): the same runc, minus the OOM score the
# kubelet asks for (-998 for the pause container, -997 for guaranteed pods), which root here may
# not set (no CAP_SYS_RESOURCE): it is taken out of the bundle's config.json before runc reads it.
bundle=
prev=
for a in "$@"; do
  case "$prev" in --bundle | -b) bundle=$a ;; esac
  case "$a" in --bundle=*) bundle=${a#--bundle=} ;; esac
  prev=$a
done
if [ -n "$bundle" ] && [ -f "$bundle/config.json" ] && grep -q '"oomScoreAdj"' "$bundle/config.json"; then
  sed -i -E 's/,"oomScoreAdj":-?[0-9]+//' "$bundle/config.json"
fi
exec /usr/sbin/runc "$@"
