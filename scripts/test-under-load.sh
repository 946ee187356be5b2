#!/usr/bin/env bash
# Runs the whole suite three times in a row on a clean clone while both cores are kept busy by
# another process, and reports the three wall times. A flaky test is a failing test: all three
# runs must pass.   bash scripts/test-under-load.sh [runs]
set -euo pipefail
runs="${1:-3}"
src="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d -t slipway-load-XXXXXX)"
git clone -q "$src" "$work/clone"
cd "$work/clone"
burners=()
cleanup() {
  for pid in "${burners[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
# One busy loop per core, at normal priority: the suite competes for every cycle.
for _ in $(seq "$(nproc)"); do
  (while :; do :; done) &
  burners+=("$!")
done
times=()
for i in $(seq "$runs"); do
  start=$(date +%s)
  if ! npm test >"$work/run-$i.log" 2>&1; then
    echo "run $i FAILED after $(( $(date +%s) - start )) s; log:" >&2
    grep -E "FAIL|×" "$work/run-$i.log" | head -40 >&2
    exit 1
  fi
  times+=("$(( $(date +%s) - start ))")
  echo "run $i passed in ${times[-1]} s"
done
echo "all $runs runs passed under load: ${times[*]} s"
