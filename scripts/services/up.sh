#!/usr/bin/env bash
# Brings up the services the txoutbox tests talk to, all on 127.0.0.1. Idempotent: a service whose
# port already answers is left alone; only the others are started, and their PIDs are recorded in
# scripts/services/.run/ so that down.sh stops only what this script started. Missing Debian
# packages are installed with apt-get; azurite and fauxqs come from npm (pinned in package.json), as does
# the CloudEvents JS SDK (and amqplib) that interop tests read and write our messages with.
#
# Usage: scripts/services/up.sh [SERVICE...]   (default: all of postgres mariadb nats rabbitmq azurite fauxqs
#        azuriteblob moto, and the Chromium that the web console's browser test drives)
#
# The tests use these defaults (override by exporting them):
#   TXOUTBOX_PG_URL=postgres://postgres@127.0.0.1:5432/test?sslmode=disable
#   TXOUTBOX_MYSQL_DSN=root@tcp(127.0.0.1:3306)/test?parseTime=true&multiStatements=true
#   TXOUTBOX_NATS_URL=nats://127.0.0.1:4222
#   TXOUTBOX_AZURITE_CONN=DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;QueueEndpoint=http://127.0.0.1:10001/devstoreaccount1;
#   TXOUTBOX_SQS_ENDPOINT=http://127.0.0.1:4566
#   TXOUTBOX_AMQP_URL=amqp://guest:guest@127.0.0.1:5672/
#   TXOUTBOX_AZURITE_BLOB_CONN=DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;
#   TXOUTBOX_S3_ENDPOINT=http://127.0.0.1:5000   (moto_server: path-style, any credentials)
#
# To add a service: add it to ALL, PORT and WAIT, and write start_NAME (starts it in the
# background and sets PID[NAME]); optionally setup_NAME (runs once the port answers, also when
# the service was already running: create databases, check features).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"
run=$here/.run
mkdir -p "$run"
exec 9>"$run/lock" && flock 9 # one up.sh at a time

ALL=(postgres mariadb nats rabbitmq azurite fauxqs azuriteblob moto)
declare -A PORT=([postgres]=5432 [mariadb]=3306 [nats]=4222 [rabbitmq]=5672 [azurite]=10001 [fauxqs]=4566
  [azuriteblob]=10000 [moto]=5000)
declare -A WAIT=([postgres]=30 [mariadb]=60 [nats]=20 [rabbitmq]=90 [azurite]=60 [fauxqs]=30
  [azuriteblob]=60 [moto]=60) # seconds
declare -A PID=()
installed=() # what this run installed, printed at the end

fail() { echo "up.sh: $*" >&2; exit 1; }

answers() { timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }

# need BINARY DEBIAN_PACKAGE: install the package when the binary is missing.
need() {
  command -v "$1" >/dev/null && return
  if [[ -z ${apt_updated:-} ]]; then apt-get update -qq || fail "apt-get update failed"; apt_updated=1; fi
  echo "$2: installing with apt-get"
  installed+=("$2 $(dpkg-query -W -f '${Version}' "$2" 2>/dev/null || true) (apt)")
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >"$run/apt-$2.log" 2>&1 ||
    { tail -n 20 "$run/apt-$2.log" >&2; fail "apt-get install $2 failed (log: $run/apt-$2.log)"; }
  command -v "$1" >/dev/null || fail "$1 still missing after installing $2"
}

# Close inherited descriptors above stderr (e.g. a CI runner's pipes): a daemon must not hold them.
closefds() {
  local fd
  for fd in /proc/self/fd/*; do
    fd=${fd##*/}
    if ((fd > 2)) && [[ -e /proc/self/fd/$fd ]]; then exec {fd}>&-; fi
  done
}

# spawn NAME CMD...: run CMD detached in the background, output to .run/NAME.log.
spawn() {
  local name=$1; shift
  (cd "$run" && closefds && exec setsid nohup "$@" >"$run/$name.log" 2>&1 </dev/null) &
  PID[$name]=$!
}

# npm packages go to scripts/services/node_modules (the emulators, and the CloudEvents SDK
# and amqplib of the RabbitMQ interop tests); reinstalled when package*.json change.
node_deps() {
  [[ -n ${node_ready:-} ]] && return
  command -v node >/dev/null || fail "node not found (azurite, fauxqs and the interop tests need Node 20+)"
  local stamp=$here/node_modules/.txoutbox-stamp
  if [[ ! -f $stamp || $(cat "$stamp") != "$(cd "$here" && cat package.json package-lock.json | sha256sum)" ]]; then
    echo "npm: installing scripts/services/package.json into scripts/services/node_modules (takes ~1 min)"
    (cd "$here" && npm install --no-audit --no-fund) >"$run/npm-install.log" 2>&1 ||
      { tail -n 30 "$run/npm-install.log" >&2; fail "npm install failed (log: $run/npm-install.log)"; }
    (cd "$here" && cat package.json package-lock.json | sha256sum) >"$stamp"
    local pkg
    for pkg in azurite fauxqs cloudevents amqplib; do
      installed+=("$pkg $(node -p "require('$here/node_modules/$pkg/package.json').version" 2>/dev/null) (npm, scripts/services/node_modules)")
    done
  fi
  node_ready=1
}

# shellcheck disable=SC2012 # version directory names are plain numbers
pg_version() { ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1; }

start_postgres() {
  need pg_ctlcluster postgresql
  local ver; ver=$(pg_version)
  [[ -n $ver ]] || fail "postgres: no cluster found under /etc/postgresql"
  answers 5432 && return # apt-get install may have started it
  (closefds && exec pg_ctlcluster --skip-systemctl-redirect "$ver" main start) >"$run/postgres.log" 2>&1 </dev/null ||
    { cat "$run/postgres.log" >&2; fail "postgres: pg_ctlcluster $ver main start failed"; }
  PID[postgres]=$(head -n 1 "$(pg_lsclusters -h "$ver" main | awk '{print $6}')/postmaster.pid")
}

setup_postgres() {
  need psql postgresql-client
  local psql=(psql -h 127.0.0.1 -p 5432 -U postgres -w -d postgres -XqtA)
  if ! "${psql[@]}" -c 'select 1' >/dev/null 2>&1; then
    # A fresh Debian install asks for a password on 127.0.0.1; the tests connect without one.
    local ver hba; ver=$(pg_version); hba=/etc/postgresql/$ver/main/pg_hba.conf
    [[ -w $hba ]] || fail "postgres: cannot log in as postgres on 127.0.0.1 without a password"
    echo "postgres: allowing trust auth for user postgres from 127.0.0.1 in $hba"
    sed -i '1i host all postgres 127.0.0.1/32 trust # added by txoutbox scripts/services/up.sh' "$hba"
    pg_ctlcluster --skip-systemctl-redirect "$ver" main reload
    local deadline=$((SECONDS + 10))
    until "${psql[@]}" -c 'select 1' >/dev/null 2>&1; do
      ((SECONDS < deadline)) || fail "postgres: still cannot log in as postgres on 127.0.0.1"
      sleep 0.2
    done
  fi
  [[ $("${psql[@]}" -c "select 1 from pg_database where datname = 'test'") == 1 ]] ||
    "${psql[@]}" -c 'create database test'
}

start_mariadb() {
  need /usr/sbin/mariadbd mariadb-server
  answers 3306 && return # apt-get install may have started it
  install -d -o mysql -g mysql /run/mysqld
  spawn mariadb /usr/sbin/mariadbd --user=mysql --bind-address=127.0.0.1 --port=3306
}

setup_mariadb() {
  need mariadb mariadb-client
  local sql=(mariadb -h 127.0.0.1 -P 3306 -u root)
  if ! "${sql[@]}" -e 'select 1' >/dev/null 2>&1; then
    # A fresh Debian install lets root in only through the unix socket; the tests use TCP.
    echo "mariadb: allowing root without password from 127.0.0.1"
    mariadb -u root -e "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1';
      ALTER USER 'root'@'127.0.0.1' IDENTIFIED BY '';
      GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;
      ALTER USER 'root'@'localhost' IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD('');" ||
      fail "mariadb: cannot log in as root on 127.0.0.1 without a password"
  fi
  "${sql[@]}" -e 'CREATE DATABASE IF NOT EXISTS test'
}

start_nats() {
  need /usr/sbin/nats-server nats-server
  answers 4222 && return # apt-get install may have started it
  mkdir -p /var/lib/nats-server
  spawn nats /usr/sbin/nats-server -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server
}

setup_nats() { # the server greets every client with an INFO line that says whether JetStream is on
  local info
  # shellcheck disable=SC2016 # $l is expanded by the inner bash
  info=$(timeout 2 bash -c 'exec 3<>/dev/tcp/127.0.0.1/4222 && IFS= read -r l <&3 && echo "$l"') || true
  [[ $info == *'"jetstream":true'* ]] || fail "nats: 127.0.0.1:4222 answers but without JetStream (needs -js)"
}

# RabbitMQ runs in the foreground under runuser, as its Debian package's user: its start
# script turns SIGTERM (down.sh) into a clean stop. AMQP, the Erlang distribution port and
# epmd (which erl starts, and which keeps running after the broker stops, as a system
# daemon would) bind to loopback. The default guest/guest user may log in from loopback.
start_rabbitmq() {
  need /usr/lib/rabbitmq/bin/rabbitmq-server rabbitmq-server
  answers "${PORT[rabbitmq]}" && return # apt-get install may have started it
  spawn rabbitmq runuser -u rabbitmq -- env HOME=/var/lib/rabbitmq \
    RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT="${PORT[rabbitmq]}" ERL_EPMD_ADDRESS=127.0.0.1 \
    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS='-kernel inet_dist_use_interface {127,0,0,1}' \
    /usr/lib/rabbitmq/bin/rabbitmq-server
}

start_azurite() {
  node_deps
  spawn azurite node "$here/node_modules/azurite/dist/src/queue/main.js" --queueHost 127.0.0.1 \
    --queuePort 10001 --inMemoryPersistence --disableTelemetry --skipApiVersionCheck --silent
}

start_fauxqs() {
  node_deps
  spawn fauxqs env FAUXQS_PORT=4566 node "$here/fauxqs.mjs"
}

# Azurite's blob service, for the claim check's Azure Blob store (claimcheck/azblob).
start_azuriteblob() {
  node_deps
  spawn azuriteblob node "$here/node_modules/azurite/dist/src/blob/main.js" --blobHost 127.0.0.1 \
    --blobPort 10000 --inMemoryPersistence --disableTelemetry --skipApiVersionCheck --silent
}

# moto's server (Python, `pip install 'moto[server]'`), for the claim check's S3 store
# (claimcheck/s3). It also speaks SQS; the SQS tests keep fauxqs.
start_moto() {
  command -v moto_server >/dev/null || fail "moto: moto_server not found (pip install 'moto[server]')"
  spawn moto moto_server -H 127.0.0.1 -p 5000
}


names=("$@")
everything=0
((${#names[@]})) || { names=("${ALL[@]}"); everything=1; }
for name in "${names[@]}"; do
  [[ -n ${PORT[$name]:-} ]] || fail "unknown service '$name' (known: ${ALL[*]})"
done

# The interop tests read our messages with the CloudEvents JS SDK from the same node_modules,
# so install it even when the emulators are already running (from another checkout).
if [[ " ${names[*]} " == *" azurite "* || " ${names[*]} " == *" azuriteblob "* || " ${names[*]} " == *" fauxqs "* || " ${names[*]} " == *" rabbitmq "* ]]; then node_deps 9>&-; fi

# Start everything that is down first, then wait for each: the slow ones start in parallel.
started=()
epmd_was_up=0; answers 4369 && epmd_was_up=1 # RabbitMQ's Erlang starts epmd if it is not running
for name in "${names[@]}"; do
  answers "${PORT[$name]}" && continue
  "start_$name" 9>&- # 9 is the lock: no daemon may keep it
  # Installing a Debian package may have started the service: then it is ours to stop too.
  if [[ -z ${PID[$name]:-} ]] && answers "${PORT[$name]}"; then PID[$name]=$(listener_pid "${PORT[$name]}"); fi
  [[ -z ${PID[$name]:-} ]] || started+=("$name")
done
for name in "${names[@]}"; do
  port=${PORT[$name]}
  if [[ " ${started[*]} " == *" $name "* ]]; then
    pid=${PID[$name]}
    deadline=$((SECONDS + WAIT[$name]))
    until answers "$port"; do
      if ! alive "$pid" || ((SECONDS >= deadline)); then
        [[ -f $run/$name.log ]] && tail -n 20 "$run/$name.log" >&2
        fail "$name: did not come up on 127.0.0.1:$port (pid $pid; log: $run/$name.log)"
      fi
      sleep 0.2
    done
    identity "$pid" >"$run/$name.pid"
    echo "$name: started (pid $pid)"
  else
    echo "$name: already running"
  fi
  if declare -F "setup_$name" >/dev/null; then "setup_$name"; fi
done

# epmd, started by the Erlang of a RabbitMQ this run started, outlives it: down.sh stops it last.
if ((!epmd_was_up)) && [[ " ${started[*]} " == *" rabbitmq "* ]] && answers 4369; then
  pid=$(listener_pid 4369)
  [[ -z $pid ]] || { identity "$pid" >"$run/epmd.pid"; echo "epmd: started with rabbitmq (pid $pid)"; }
fi

# Not a service but a tool the tests drive: headless Chromium for the web console's browser
# test (cmd/outbox TestConsoleInBrowser), installed with the full set. Under CI a missing
# Chromium fails that test instead of skipping it.
if ((everything)); then
  need chromium chromium
  echo "chromium: $(chromium --version 2>/dev/null | head -n 1)"
fi

if ((${#installed[@]})); then
  echo "installed by this run:"
  printf '  %s\n' "${installed[@]}"
fi
if [[ -n ${node_ready:-} ]]; then
  major=$(node -p 'process.versions.node.split(".")[0]')
  ((major >= 22)) || echo "note: node $(node --version): Azurite's dependencies declare Node 22 (npm warns EBADENGINE in $run/npm-install.log); everything here is tested on Node 20, which works"
fi
