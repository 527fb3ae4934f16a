#!/usr/bin/env bash
# Starts a 3-node sediment-raft cluster on loopback, initializes it, writes
# and reads a few keys (also through a follower, which redirects), kills the
# leader and reads through the new one, then stops every node.
#
#   scripts/cluster.sh            # ports 21001-21003, data in a temp dir
#   BASE_PORT=22000 scripts/cluster.sh
#   SEDIMENT_RAFT_BIN=target/release/sediment-raft scripts/cluster.sh
set -euo pipefail
cd "$(dirname "$0")/.."

BASE_PORT=${BASE_PORT:-21000}
DATA=$(mktemp -d "${TMPDIR:-/tmp}/sediment-raft-cluster.XXXXXX")
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$DATA"
}
trap cleanup EXIT

# SEDIMENT_RAFT_BIN names a binary built already (the tests pass their
# own); otherwise the script builds one.
if [ -n "${SEDIMENT_RAFT_BIN:-}" ]; then
  BIN=$SEDIMENT_RAFT_BIN
else
  cargo build --quiet -p sediment-raft
  # Where cargo put it: CARGO_TARGET_DIR or a configured target-dir moves
  # it out of ./target.
  TARGET_DIR=$(cargo metadata --format-version 1 --no-deps |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
  BIN="${TARGET_DIR:-target}/debug/sediment-raft"
fi

addr() { echo "127.0.0.1:$((BASE_PORT + $1))"; }

# wait_for WHAT SECONDS COMMAND...: runs COMMAND until it succeeds; gives up
# (with the end of every node's log) after SECONDS or once a node process
# that should be running has died, instead of waiting forever.
wait_for() {
  local what=$1 deadline=$((SECONDS + $2)) pid
  shift 2
  until "$@"; do
    for pid in "${PIDS[@]}"; do
      if ! kill -0 "$pid" 2>/dev/null; then
        echo "a node process ($pid) died while waiting for $what" >&2
        tail -n 5 "$DATA"/node-*.log >&2
        exit 1
      fi
    done
    if ((SECONDS >= deadline)); then
      echo "gave up waiting for $what after $2 s" >&2
      tail -n 5 "$DATA"/node-*.log >&2
      exit 1
    fi
    sleep 0.1
  done
}
# Each check is bounded too: something else may hold a node's port.
up() { curl -sf -m 2 "http://$(addr "$1")/cluster/metrics" >/dev/null; }
leader_seen_by() {
  curl -s -m 2 "http://$(addr "$1")/cluster/metrics" | sed -n 's/.*"current_leader":\([0-9null]*\).*/\1/p'
}

for id in 1 2 3; do
  "$BIN" node --id "$id" --listen "$(addr "$id")" --dir "$DATA/node-$id" \
    --heartbeat-ms 100 2>"$DATA/node-$id.log" &
  PIDS[id]=$!
done
for id in 1 2 3; do
  wait_for "node $id to serve" 60 up "$id"
done
echo "3 nodes up in $DATA"

say() { echo; echo "\$ $*"; }
run() { say "$@"; "$@"; echo; }

run curl -s -X POST "http://$(addr 1)/cluster/init" -H 'content-type: application/json' \
  -d "{\"members\": {\"1\": \"$(addr 1)\", \"2\": \"$(addr 2)\", \"3\": \"$(addr 3)\"}}"

leader=""
has_leader() {
  leader=$(leader_seen_by 1)
  [ -n "$leader" ] && [ "$leader" != null ]
}
wait_for "a leader" 60 has_leader
echo "leader: node $leader"
follower=$(( leader % 3 + 1 ))

run curl -s -X PUT "http://$(addr "$leader")/kv/greeting" --data-binary 'hello, raft'
run curl -s -X PUT "http://$(addr "$leader")/kv/colour" --data-binary 'blue'
run curl -s "http://$(addr "$leader")/kv/greeting"
say curl -s -i "http://$(addr "$follower")/kv/greeting"
curl -s -i "http://$(addr "$follower")/kv/greeting" | grep -iE '^(HTTP|location)|error'
run curl -s -L "http://$(addr "$follower")/kv/colour"
run curl -s -X DELETE "http://$(addr "$leader")/kv/colour"
say curl -s -o /dev/null -w '%{http_code}' "http://$(addr "$leader")/kv/colour"
curl -s -o /dev/null -w '%{http_code}\n' "http://$(addr "$leader")/kv/colour"
say curl -s -X PUT "http://$(addr "$leader")/kv/" --data-binary x
curl -s -w ' %{http_code}\n' -X PUT "http://$(addr "$leader")/kv/" --data-binary x

echo
echo "killing the leader (node $leader) with SIGKILL"
kill -9 "${PIDS[leader]}"
{ wait "${PIDS[leader]}"; } 2>/dev/null || true
unset 'PIDS[leader]'
new=""
has_new_leader() {
  new=$(leader_seen_by "$follower")
  [ -n "$new" ] && [ "$new" != null ] && [ "$new" != "$leader" ]
}
wait_for "a new leader" 60 has_new_leader
echo "new leader: node $new"
run curl -s "http://$(addr "$new")/kv/greeting"
run curl -s -X PUT "http://$(addr "$new")/kv/after-failover" --data-binary 'still here'

echo "restarting node $leader"
"$BIN" node --id "$leader" --listen "$(addr "$leader")" --dir "$DATA/node-$leader" \
  --heartbeat-ms 100 2>>"$DATA/node-$leader.log" &
PIDS[leader]=$!
caught_up() {
  [ "$(curl -s -m 2 "http://$(addr "$leader")/kv/after-failover?consistency=local")" = "still here" ]
}
wait_for "node $leader to catch up" 60 caught_up
run curl -s "http://$(addr "$leader")/kv/after-failover?consistency=local"
run curl -s "http://$(addr "$leader")/cluster/metrics"

for id in 1 2 3; do kill "${PIDS[id]}"; done
wait 2>/dev/null || true
PIDS=()
echo "stopped"
