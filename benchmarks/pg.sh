#!/usr/bin/env bash
# A throwaway PostgreSQL server for the benchmarks' PostgreSQL peer.
#
#   export PG_URL="$(benchmarks/pg.sh start)"  # prints postgresql://...
#   benchmarks/pg.sh url     # prints the running server's connection string
#   benchmarks/pg.sh env     # prints `export PG_URL=...`, for eval
#   benchmarks/pg.sh status
#   benchmarks/pg.sh stop    # stops the server and removes its data
#
# `start` installs Debian's `postgresql` when no server binaries are found
# (apt-get update first; needs root), runs initdb in a new temp dir under
# target/ (on the project's disk, not /tmp) as an unprivileged user
# (`pgbench`, created when running as root), and starts the server on
# 127.0.0.1 on a free port with PostgreSQL's default durability (fsync=on,
# synchronous_commit=on, full_page_writes=on). Only local TCP connections
# are accepted (trust authentication on 127.0.0.1). The connection string
# is the only thing printed on stdout; progress goes to stderr.
# PG_BENCH_DATA names a fixed data directory instead of a temp dir.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
# The temp dir of the running server is recorded here, so that `url`,
# `status` and `stop` find it.
pointer="$root/target/pg-bench.dir"
if [ -n "${PG_BENCH_DATA:-}" ]; then
  data="$PG_BENCH_DATA"
elif [ -f "$pointer" ]; then
  data="$(cat "$pointer")"
else
  data=""
fi
cluster="$data/cluster"
user_name="pgbench"
db_user="bench"

die() {
  echo "pg.sh: $*" >&2
  exit 1
}

# Removes a data directory this script made: a temp dir under target/ or
# the PG_BENCH_DATA directory, never whatever else a stale pointer names.
remove_data() {
  case "$1" in
    "$root"/target/pg-bench.*) rm -rf "$1" ;;
    *)
      if [ -n "${PG_BENCH_DATA:-}" ] && [ "$1" = "$PG_BENCH_DATA" ]; then
        rm -rf "$1"
      else
        echo "pg.sh: not removing $1 (not a directory pg.sh made)" >&2
        return 1
      fi
      ;;
  esac
}

find_bin() {
  local dir
  for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    if [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then
      echo "$dir"
      return 0
    fi
  done
  if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
    dirname "$(command -v pg_ctl)"
    return 0
  fi
  return 1
}

install_postgres() {
  [ "$(id -u)" -eq 0 ] || die "PostgreSQL is not installed and installing it needs root"
  echo "pg.sh: installing Debian's postgresql" >&2
  apt-get update >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql >&2
}

# Runs a command as the unprivileged server user (or as ourselves when we
# are not root).
as_server_user() {
  if [ "$(id -u)" -eq 0 ]; then
    runuser -u "$user_name" -- "$@"
  else
    "$@"
  fi
}

ensure_user() {
  [ "$(id -u)" -eq 0 ] || return 0
  if ! id "$user_name" >/dev/null 2>&1; then
    useradd --system --no-create-home --shell /usr/sbin/nologin "$user_name"
  fi
}

free_port() {
  local port
  for port in $(seq 54320 54420); do
    if ! ss -Hltn "sport = :$port" 2>/dev/null | grep -q .; then
      echo "$port"
      return 0
    fi
  done
  die "no free port in 54320-54420"
}

url() {
  [ -n "$data" ] && [ -f "$data/port" ] || die "no server (run: $0 start)"
  echo "postgresql://$db_user@127.0.0.1:$(cat "$data/port")/postgres"
}

running() {
  [ -n "$data" ] && [ -d "$cluster" ] && as_server_user "$bin/pg_ctl" -D "$cluster" status >/dev/null 2>&1
}

start() {
  bin="$(find_bin)" || { install_postgres; bin="$(find_bin)" || die "no PostgreSQL binaries after installing"; }
  if running; then
    echo "pg.sh: already running" >&2
    url
    return 0
  fi
  ensure_user
  mkdir -p "$root/target"
  if [ -n "${PG_BENCH_DATA:-}" ]; then
    remove_data "$data" || true
    mkdir -p "$data"
  else
    # A server that is gone (a reboot, a killed process) left its dir.
    if [ -n "$data" ]; then remove_data "$data" || true; fi
    data="$(mktemp -d "$root/target/pg-bench.XXXXXX")"
    cluster="$data/cluster"
    # Readable by all, as a plain mkdir would make it: `url` and `status`
    # read the port file as whoever runs them (the cluster stays private).
    chmod 755 "$data"
  fi
  echo "$data" >"$pointer"
  if [ "$(id -u)" -eq 0 ]; then
    chown "$user_name" "$data"
  fi
  as_server_user "$bin/initdb" -D "$cluster" --username="$db_user" --auth=trust \
    --encoding=UTF8 --locale=C >"$data/initdb.log" 2>&1 ||
    { cat "$data/initdb.log" >&2; die "initdb failed"; }
  local port
  port="$(free_port)"
  echo "$port" >"$data/port"
  # Defaults for everything that concerns durability; say them anyway.
  cat >>"$cluster/postgresql.conf" <<EOF

# pg.sh
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$cluster'
fsync = on
synchronous_commit = on
full_page_writes = on
max_connections = 100
EOF
  as_server_user "$bin/pg_ctl" -D "$cluster" -l "$data/server.log" -w -t 60 start >&2 ||
    { cat "$data/server.log" >&2; die "the server did not start"; }
  echo "pg.sh: PostgreSQL $("$bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$port, data in $cluster" >&2
  url
}

stop() {
  bin="$(find_bin)" || die "no PostgreSQL binaries"
  if running; then
    as_server_user "$bin/pg_ctl" -D "$cluster" -m fast -w stop >&2
  fi
  if [ -z "$data" ]; then
    echo "pg.sh: no server to stop" >&2
    return 0
  fi
  rm -f "$pointer"
  if remove_data "$data"; then
    echo "pg.sh: stopped and removed $data" >&2
  fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  url) url ;;
  env)
    u="$(url)"
    echo "export PG_URL=$u"
    ;;
  status)
    bin="$(find_bin)" || die "no PostgreSQL binaries"
    if running; then
      u="$(url)"
      echo "running: $u"
    else
      echo "not running"
      exit 1
    fi
    ;;
  *)
    echo "usage: $0 start|stop|url|env|status" >&2
    exit 2
    ;;
esac
