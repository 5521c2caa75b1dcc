#!/usr/bin/env bash
# Runs the whole test suite: brings up the services (scripts/services/up.sh), then in every module
# listed in go.work runs `go vet ./...` and `go test -race -count=1 -timeout 20m ./...`, then checks
# that all .go files are gofmt-clean. Goes on through all modules; exits non-zero if anything failed.
# On exit it stops the services that this run started (scripts/services/down.sh), and leaves
# alone those that were already running: start them with `make services` to keep them between
# runs, or set KEEP_SERVICES=1.
# Usage: scripts/test.sh [go test flags...]   e.g. scripts/test.sh -run Relay -v
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
list=$(scripts/modules.sh)
mapfile -t modules <<<"$list"

# Same values the tests default to; CI and anything else already set are kept as given.
export TXOUTBOX_PG_URL=${TXOUTBOX_PG_URL:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}
export TXOUTBOX_MYSQL_DSN=${TXOUTBOX_MYSQL_DSN:-root@tcp(127.0.0.1:3306)/test?parseTime=true&multiStatements=true}
export TXOUTBOX_NATS_URL=${TXOUTBOX_NATS_URL:-nats://127.0.0.1:4222}
export TXOUTBOX_AZURITE_CONN=${TXOUTBOX_AZURITE_CONN:-DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;QueueEndpoint=http://127.0.0.1:10001/devstoreaccount1;}
export TXOUTBOX_SQS_ENDPOINT=${TXOUTBOX_SQS_ENDPOINT:-http://127.0.0.1:4566}
export TXOUTBOX_AMQP_URL=${TXOUTBOX_AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/}
export TXOUTBOX_AZURITE_BLOB_CONN=${TXOUTBOX_AZURITE_BLOB_CONN:-DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;}
export TXOUTBOX_S3_ENDPOINT=${TXOUTBOX_S3_ENDPOINT:-http://127.0.0.1:5000}
export GOTRACEBACK=all      # every goroutine's stack when a test panics or times out
export GIT_TERMINAL_PROMPT=0 # a module fetch never waits for a password

# The services this run starts are those whose PID files up.sh writes now.
pids=scripts/services/.run
before=$(ls "$pids"/*.pid 2>/dev/null || true)
stop_started() {
  local f started=()
  for f in "$pids"/*.pid; do
    [[ -e $f ]] && ! grep -qxF "$f" <<<"$before" && started+=("$(basename "$f" .pid)")
  done
  if ((${#started[@]} == 0)); then
    echo "=== services: this run started none; left as they were"
  elif [[ -n ${KEEP_SERVICES:-} ]]; then
    echo "=== services: KEEP_SERVICES is set, leaving running what this run started: ${started[*]} (stop them with make services-down)"
  else
    echo "=== services: stopping what this run started: ${started[*]}"
    scripts/services/down.sh "${started[@]}" || true
  fi
}
trap stop_started EXIT
scripts/services/up.sh

summary=() passed=0 failed=0
for m in "${modules[@]}"; do
  echo "=== $m"
  ok=1
  (cd "$m" && go vet ./...) || ok=0
  (cd "$m" && go test -race -count=1 -timeout 20m "$@" ./...) || ok=0
  if ((ok)); then summary+=("ok   $m"); passed=$((passed + 1)); else summary+=("FAIL $m"); failed=$((failed + 1)); fi
done

echo "=== gofmt"
fmt=ok
list=$(git ls-files --cached --others --exclude-standard -- '*.go')
files=()
[[ -z $list ]] || while IFS= read -r f; do [[ -f $f ]] && files+=("$f"); done <<<"$list"
if ((${#files[@]})); then
  if ! unformatted=$(gofmt -l "${files[@]}"); then fmt=FAIL; fi
  if [[ -n $unformatted ]]; then echo "not gofmt-clean (run gofmt -w):"; echo "$unformatted"; fmt=FAIL; fi
fi

echo "=== summary"
printf '%s\n' "${summary[@]}"
echo "gofmt: $fmt"
echo "$passed passed, $failed failed"
((failed == 0)) && [[ $fmt == ok ]]
