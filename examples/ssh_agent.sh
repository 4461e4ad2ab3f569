#!/usr/bin/env bash
# An external agent for robolab, written against the command agent contract
# (see command_agent.ts): it reads its task from the environment, works in
# the workspace over OpenSSH's ssh through the local forwarder, and prints
# its answer on stdout. It knows one repair: the off-by-one in count.sh.
#
#   deno run -A examples/robolab.ts --agent examples/ssh_agent.sh
set -euo pipefail

prompt=$(cat)                                   # the prompt, also in $HUD_PROMPT
url="$HUD_CAP_SHELL_URL"                        # ssh://agent@127.0.0.1:PORT
port="${url##*:}"
dir=$(printf '%s' "$HUD_BINDINGS" | sed -E 's/.*"cwd":"([^"]+)".*/\1/')
ask=$(printf '%s' "$prompt" | sed -E 's/.*`([^`]+)`.*/\1/')

remote() {
  ssh -q -i "$HUD_CAP_SHELL_KEY_FILE" -p "$port" -o BatchMode=yes \
    -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
    "$HUD_CAP_SHELL_USER@127.0.0.1" "cd '$dir' && $1"
}

remote "sed -i 's/-lt \"\$n\"/-le \"\$n\"/' count.sh 2>/dev/null || true"
remote "$ask"
