#!/usr/bin/env bash
# A throwaway etcd cluster for the benchmarks' replication section.
#
#   export ETCD_ENDPOINTS="$(benchmarks/etcd.sh start 3)"  # http://127.0.0.1:...,...
#   benchmarks/etcd.sh urls     # prints the running members' client URLs
#   benchmarks/etcd.sh pids     # prints the members' process ids, one a line
#   benchmarks/etcd.sh status
#   benchmarks/etcd.sh stop     # stops every member and removes the data
#
# `start [N]` starts N members (1 or 3; default 3). It installs Debian's
# `etcd-server` when no `etcd` binary is found (apt-get update first; needs
# root), creates a new temp dir under target/ (on the project's disk, not
# /tmp), and starts the members on 127.0.0.1 on free ports (two a member:
# client and peer, 23790 and up) with etcd's default durability (the WAL
# is fsynced before a write is acknowledged; `--unsafe-no-fsync` is not
# given). The backend quota is raised to 8 GiB so that a long run of fresh
# keys does not raise the space alarm; nothing is compacted. The client
# URLs, comma-separated, are the only thing printed on stdout; progress
# goes to stderr. Each member logs to m<N>.log in the data directory.
#
# ETCD_BENCH_DATA names a fixed data directory instead of a temp dir (then
# `urls`, `pids`, `status` and `stop` need it too); ETCD_BIN names the etcd
# binary.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
# The temp dir of the running cluster is recorded here, so that `urls`,
# `pids`, `status` and `stop` find it.
pointer="$root/target/etcd-bench.dir"
if [ -n "${ETCD_BENCH_DATA:-}" ]; then
  data="$ETCD_BENCH_DATA"
elif [ -f "$pointer" ]; then
  data="$(cat "$pointer")"
else
  data=""
fi

die() {
  echo "etcd.sh: $*" >&2
  exit 1
}

# Removes a data directory this script made: a temp dir under target/ or
# the ETCD_BENCH_DATA directory, never whatever else a stale pointer names.
remove_data() {
  case "$1" in
    "$root"/target/etcd-bench.*) rm -rf "$1" ;;
    *)
      if [ -n "${ETCD_BENCH_DATA:-}" ] && [ "$1" = "$ETCD_BENCH_DATA" ]; then
        rm -rf "$1"
      else
        echo "etcd.sh: not removing $1 (not a directory etcd.sh made)" >&2
        return 1
      fi
      ;;
  esac
}

find_bin() {
  if [ -n "${ETCD_BIN:-}" ]; then
    [ -x "$ETCD_BIN" ] || return 1
    echo "$ETCD_BIN"
    return 0
  fi
  command -v etcd 2>/dev/null && return 0
  [ -x /usr/bin/etcd ] && echo /usr/bin/etcd && return 0
  return 1
}

install_etcd() {
  [ "$(id -u)" -eq 0 ] || die "etcd is not installed and installing it needs root"
  echo "etcd.sh: installing Debian's etcd-server" >&2
  apt-get update >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends etcd-server >&2
}

port_free() {
  ! ss -Hltn "sport = :$1" 2>/dev/null | grep -q .
}

# Prints 2*N free ports, starting at 23790.
free_ports() {
  local want=$(($1 * 2)) port found=()
  for port in $(seq 23790 24790); do
    if port_free "$port"; then
      found+=("$port")
      if [ "${#found[@]}" -eq "$want" ]; then
        echo "${found[@]}"
        return 0
      fi
    fi
  done
  die "not enough free ports in 23790-24790"
}

members() {
  [ -n "$data" ] && [ -f "$data/members" ] || return 1
  cat "$data/members"
}

urls() {
  local list
  list="$(members)" || die "no cluster (run: $0 start)"
  echo "$list" | awk '{print "http://127.0.0.1:" $2}' | paste -sd, -
}

pids() {
  local list id
  list="$(members)" || die "no cluster (run: $0 start)"
  for id in $(echo "$list" | awk '{print $1}'); do
    [ -f "$data/m$id.pid" ] && cat "$data/m$id.pid"
  done
}

# Every member's process is alive and answers /health.
running() {
  local list id client pid
  list="$(members)" || return 1
  while read -r id client _; do
    pid="$(cat "$data/m$id.pid" 2>/dev/null)" || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    curl -sf -m 2 "http://127.0.0.1:$client/health" | grep -q '"health":"true"' || return 1
  done <<<"$list"
}

start() {
  local count="${1:-3}"
  case "$count" in
    1 | 3) ;;
    *) die "start takes 1 or 3 members, not $count" ;;
  esac
  if [ -n "${ETCD_BIN:-}" ]; then
    bin="$(find_bin)" || die "ETCD_BIN=$ETCD_BIN is not an executable"
  else
    bin="$(find_bin)" || { install_etcd; bin="$(find_bin)" || die "no etcd binary after installing"; }
  fi
  if [ -n "$data" ] && [ -f "$data/members" ]; then
    if running; then
      echo "etcd.sh: already running" >&2
      urls
      return 0
    fi
    # A cluster that is gone (a reboot, a killed process) left its dir.
    stop_members
  fi
  mkdir -p "$root/target"
  if [ -n "${ETCD_BENCH_DATA:-}" ]; then
    remove_data "$data" || true
    mkdir -p "$data"
  else
    if [ -n "$data" ]; then remove_data "$data" || true; fi
    data="$(mktemp -d "$root/target/etcd-bench.XXXXXX")"
    chmod 755 "$data"
    echo "$data" >"$pointer"
  fi
  local ports i client peer cluster="" token
  read -r -a ports <<<"$(free_ports "$count")"
  : >"$data/members"
  for i in $(seq 1 "$count"); do
    client="${ports[$(((i - 1) * 2))]}"
    peer="${ports[$(((i - 1) * 2 + 1))]}"
    echo "$i $client $peer" >>"$data/members"
    cluster="${cluster:+$cluster,}m$i=http://127.0.0.1:$peer"
  done
  token="bench-$(basename "$data")"
  while read -r i client peer; do
    # etcd makes its data dir itself, with the 0700 mode it insists on.
    "$bin" --name "m$i" --data-dir "$data/m$i" \
      --listen-client-urls "http://127.0.0.1:$client" \
      --advertise-client-urls "http://127.0.0.1:$client" \
      --listen-peer-urls "http://127.0.0.1:$peer" \
      --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
      --initial-cluster "$cluster" --initial-cluster-state new \
      --initial-cluster-token "$token" \
      --quota-backend-bytes $((8 << 30)) \
      --logger zap \
      </dev/null >"$data/m$i.log" 2>&1 &
    echo $! >"$data/m$i.pid"
  done <"$data/members"
  local deadline=$((SECONDS + 60)) pid
  until running; do
    while read -r i _; do
      pid="$(cat "$data/m$i.pid")"
      if ! kill -0 "$pid" 2>/dev/null; then
        tail -n 20 "$data/m$i.log" >&2
        stop_members
        die "member m$i exited while starting (log above)"
      fi
    done <"$data/members"
    if ((SECONDS >= deadline)); then
      tail -n 5 "$data"/m*.log >&2
      stop_members
      die "the cluster did not become healthy within 60 s"
    fi
    sleep 0.2
  done
  echo "etcd.sh: etcd $("$bin" --version | awk '/etcd Version/ {print $3}'), $count member(s), data in $data" >&2
  urls
}

# Stops every member (SIGTERM, then SIGKILL after 10 s).
stop_members() {
  local list id pid waited
  list="$(members)" || return 0
  for id in $(echo "$list" | awk '{print $1}'); do
    pid="$(cat "$data/m$id.pid" 2>/dev/null)" || continue
    kill "$pid" 2>/dev/null || true
  done
  for id in $(echo "$list" | awk '{print $1}'); do
    pid="$(cat "$data/m$id.pid" 2>/dev/null)" || continue
    waited=0
    while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt 100 ]; do
      sleep 0.1
      waited=$((waited + 1))
    done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$data/m$id.pid"
  done
}

stop() {
  if [ -z "$data" ]; then
    echo "etcd.sh: no cluster to stop" >&2
    return 0
  fi
  stop_members
  if [ -z "${ETCD_BENCH_DATA:-}" ]; then rm -f "$pointer"; fi
  if remove_data "$data"; then
    echo "etcd.sh: stopped and removed $data" >&2
  fi
}

case "${1:-}" in
  start) start "${2:-3}" ;;
  stop) stop ;;
  urls) urls ;;
  pids) pids ;;
  status)
    if running; then
      echo "running: $(urls)"
    else
      echo "not running"
      exit 1
    fi
    ;;
  *)
    echo "usage: $0 start [1|3]|stop|urls|pids|status" >&2
    exit 2
    ;;
esac
