#!/usr/bin/env bash
# Runs the benchmarks of every module listed in go.work, after bringing up the services.
# Usage: scripts/bench.sh [go test flags...]   e.g. scripts/bench.sh -bench Relay -benchtime 5s
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
list=$(scripts/modules.sh)
mapfile -t modules <<<"$list"

scripts/services/up.sh

failed=()
for m in "${modules[@]}"; do
  echo "=== $m"
  (cd "$m" && go test -run '^$' -bench . -benchtime 1s -benchmem "$@" ./...) || failed+=("$m")
done
((${#failed[@]} == 0)) || { echo "benchmarks failed in: ${failed[*]}" >&2; exit 1; }
