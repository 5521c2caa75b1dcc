#!/usr/bin/env bash
# Stops the services that up.sh started (by the PIDs it recorded in .run/); leaves alone anything
# that was already running when up.sh ran. Usage: scripts/services/down.sh [SERVICE...]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh" # identity: "PID STARTTIME", so a recycled PID is never signalled
run=$here/.run

if (($#)); then names=("$@"); else
  names=()
  for f in "$run"/*.pid; do [[ -e $f ]] && names+=("$(basename "$f" .pid)"); done
fi
# epmd last: RabbitMQ's Erlang node talks to it until it stops.
ordered=()
for name in "${names[@]}"; do [[ $name == epmd ]] || ordered+=("$name"); done
[[ " ${names[*]} " == *" epmd "* ]] && ordered+=(epmd)
names=("${ordered[@]}")

rc=0
for name in "${names[@]}"; do
  f=$run/$name.pid
  if [[ ! -f $f ]]; then echo "$name: not started by up.sh"; continue; fi
  read -r pid start <"$f"
  if ! alive "$pid" || [[ $(identity "$pid" 2>/dev/null) != "$pid $start" ]]; then
    echo "$name: not running"; rm -f "$f"; continue
  fi
  sig=TERM; [[ $name == postgres ]] && sig=INT # postgres: fast shutdown, don't wait for idle clients
  kill -s "$sig" "$pid"
  deadline=$((SECONDS + 30))
  while alive "$pid" && ((SECONDS < deadline)); do sleep 0.2; done
  if alive "$pid"; then echo "$name: still running 30 s after SIG$sig (pid $pid)" >&2; rc=1; continue; fi
  rm -f "$f"
  echo "$name: stopped (pid $pid)"
done
exit "$rc"
