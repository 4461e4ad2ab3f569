#!/usr/bin/env bash
# The command agent of bench/faults.ts: it always solves its task (write the
# number into the file, over SSH through the client's forwarder), retrying
# its own steps when a connection is cut or the disk is full, as a careful
# agent does. Only a kill of this process itself stops it.
prompt=$(cat)
n=$(printf '%s' "$prompt" | sed -E 's/.*number ([0-9]+).*/\1/')
file=$(printf '%s' "$prompt" | sed -E 's/.*file ([^ ]+\.txt).*/\1/')
url="$HUD_CAP_SHELL_URL"
port="${url##*:}"
sleep 0.3 # a window to be killed in
for _ in $(seq 1 40); do
  if ssh -q -i "$HUD_CAP_SHELL_KEY_FILE" -p "$port" -o BatchMode=yes -o ConnectTimeout=10 \
    -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
    "$HUD_CAP_SHELL_USER@127.0.0.1" "echo $n > $file" 2>/dev/null; then
    echo "wrote $n"
    exit 0
  fi
  sleep 0.2
done
echo "could not write $n" >&2
exit 1
