#!/usr/bin/env bash
# The demo: installs what is needed, makes a throwaway repository, and runs an objective with
# three streams on the embedded Temporal server. Leaves `slipway dev` running so the Web UI can
# show the run afterwards (stopped at the end when CI=true or with --stop).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bash scripts/setup.sh --quiet

stop_after=false
[ "${1:-}" = "--stop" ] && stop_after=true
[ "${CI:-}" = "true" ] && stop_after=true

export SLIPWAY_HOME=${SLIPWAY_HOME:-${XDG_DATA_HOME:-$HOME/.local/share}/slipway}
port=${SLIPWAY_TEMPORAL_PORT:-7233}
ui_port=${SLIPWAY_UI_PORT:-8233}
mkdir -p "$SLIPWAY_HOME"

work=$(mktemp -d "${TMPDIR:-/tmp}/slipway-demo-XXXXXX")
repo=$work/toolkit
bash examples/demo/make-repo.sh "$repo" >/dev/null
echo "demo repository: $repo"

dev_pid=""
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
if [ -z "${TEMPORAL_ADDRESS:-}" ] && ! port_open "$port"; then
  log=$SLIPWAY_HOME/dev.log
  node bin/slipway.cjs dev >"$log" 2>&1 &
  dev_pid=$!
  echo "starting the embedded Temporal server and a worker (slipway dev, pid $dev_pid, log $log)"
  for _ in $(seq 1 240); do
    grep -q "worker polling" "$log" 2>/dev/null && break
    kill -0 "$dev_pid" 2>/dev/null || { echo "slipway dev exited:"; cat "$log"; exit 1; }
    sleep 0.5
  done
fi

id="demo-$(date -u +%Y%m%d-%H%M%S)"
start=$(date +%s)
status=0
node bin/slipway.cjs run examples/demo/objective.yaml --repo "$repo" --id "$id" --follow || status=$?
echo "demo wall time: $(( $(date +%s) - start )) s"
echo
echo "integration branch log:"
git -C "$repo" log --oneline --graph "slipway/$id/integration" | head -20

if [ -n "$dev_pid" ]; then
  if $stop_after; then
    kill -TERM "$dev_pid"; wait "$dev_pid" 2>/dev/null || true
  else
    echo
    echo "Web UI: http://localhost:$ui_port/namespaces/default/workflows (slipway dev keeps running as pid $dev_pid; stop it with: kill $dev_pid)"
  fi
fi
exit $status
