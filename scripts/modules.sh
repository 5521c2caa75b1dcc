#!/usr/bin/env bash
# Prints the module directories of the Go workspace, one per line, as its go.work `use`
# directives list them (".", "./adapters/pgx", ...), read with Go's own parser.
# Usage: scripts/modules.sh [path/to/go.work]   (default: go.work at the repo root)
set -euo pipefail

work=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/go.work}
[[ -f $work ]] || { echo "modules.sh: $work is missing (it lists the repo's modules)" >&2; exit 1; }
json=$(go work edit -json "$work")
dirs=$(sed -n 's/^[[:space:]]*"DiskPath": "\(.*\)",\{0,1\}$/\1/p' <<<"$json")
[[ -n $dirs ]] || { echo "modules.sh: $work has no 'use' directives" >&2; exit 1; }
echo "$dirs"
