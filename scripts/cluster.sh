#!/usr/bin/env bash
# Starts a 3-node sediment-raft cluster on loopback, initializes it, writes
# and reads a few keys (also through a follower, which redirects), kills the
# leader and reads through the new one, then stops every node.
#
#   scripts/cluster.sh            # ports 21001-21003, data in a temp dir
#   BASE_PORT=22000 scripts/cluster.sh
#   SEDIMENT_RAFT_BIN=target/release/sediment-raft scripts/cluster.sh
#   SECURE=1 scripts/cluster.sh   # HTTPS, mutual TLS and a bearer token
#
# SECURE=1 makes a throwaway CA, a node certificate, a client certificate
# and a token with openssl (in the temp dir, deleted at the end), starts
# the nodes with --tls-cert/--tls-key/--tls-ca/--token-file and runs curl
# with the CA, the client certificate and the token.
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

SCHEME=http
NODE_ARGS=()
CURL_OPTS=()
# curl does not repeat a token on a redirect to another port unless told.
FOLLOW=(-L)
if [ "${SECURE:-0}" = 1 ]; then
  if ! command -v openssl >/dev/null 2>&1; then
    echo "SECURE=1 needs openssl to make the certificates" >&2
    exit 1
  fi
  TLS="$DATA/tls"
  mkdir -p "$TLS"
  (
    cd "$TLS"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
      -keyout ca-key.pem -out ca.pem -subj "/CN=cluster.sh throwaway CA" 2>/dev/null
    for name in node client; do
      openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
        -keyout "$name-key.pem" -out "$name.csr" -subj "/CN=cluster.sh $name" 2>/dev/null
      printf '%s\n' "subjectAltName=IP:127.0.0.1,DNS:localhost" \
        "extendedKeyUsage=serverAuth,clientAuth" "basicConstraints=CA:FALSE" >"$name.ext"
      openssl x509 -req -in "$name.csr" -CA ca.pem -CAkey ca-key.pem -CAcreateserial \
        -days 1 -extfile "$name.ext" -out "$name.pem" 2>/dev/null
    done
    openssl rand -hex 32 >token
    # curl reads the header from the file: the token stays off command lines.
    printf 'Authorization: Bearer %s\n' "$(cat token)" >auth-header
  )
  SCHEME=https
  NODE_ARGS=(--tls-cert "$TLS/node.pem" --tls-key "$TLS/node-key.pem"
    --tls-ca "$TLS/ca.pem" --token-file "$TLS/token")
  CURL_OPTS=(--cacert "$TLS/ca.pem" --cert "$TLS/client.pem" --key "$TLS/client-key.pem"
    -H "@$TLS/auth-header")
  FOLLOW=(--location-trusted)
  echo "TLS and a token: nodes get ${NODE_ARGS[*]}"
  echo "curl below runs with ${CURL_OPTS[*]}"
fi
# Every curl below goes through the cluster's TLS and token when SECURE=1.
curl() { command curl "${CURL_OPTS[@]}" "$@"; }

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
up() { curl -sf -m 2 "$SCHEME://$(addr "$1")/cluster/metrics" >/dev/null; }
leader_seen_by() {
  curl -s -m 2 "$SCHEME://$(addr "$1")/cluster/metrics" | sed -n 's/.*"current_leader":\([0-9null]*\).*/\1/p'
}

# A port something else listens on (another cluster's node, say) would
# send this script's requests there: nothing starts then.
for id in 1 2 3; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$((BASE_PORT + id))") 2>/dev/null; then
    echo "port $((BASE_PORT + id)) (node $id) is in use by another process;" \
      "pick free ports with BASE_PORT=..." >&2
    exit 1
  fi
done
for id in 1 2 3; do
  "$BIN" node --id "$id" --listen "$(addr "$id")" --dir "$DATA/node-$id" \
    --heartbeat-ms 100 "${NODE_ARGS[@]}" 2>"$DATA/node-$id.log" &
  PIDS[id]=$!
done
for id in 1 2 3; do
  wait_for "node $id to serve" 60 up "$id"
done
echo "3 nodes up in $DATA"

# Prints a command as it could be pasted into a shell: arguments with
# characters the shell treats specially are single-quoted.
say() {
  local arg out="\$"
  for arg in "$@"; do
    if [[ $arg =~ ^[A-Za-z0-9_./:%@=-]+$ ]]; then
      out+=" $arg"
    else
      out+=" '${arg//\'/\'\\\'\'}'"
    fi
  done
  echo
  echo "$out"
}
run() { say "$@"; "$@"; echo; }

say curl -s -X POST "$SCHEME://$(addr 1)/cluster/init" -H 'content-type: application/json' \
  -d "{\"members\": {\"1\": \"$(addr 1)\", \"2\": \"$(addr 2)\", \"3\": \"$(addr 3)\"}}"
init=$(curl -s -X POST "$SCHEME://$(addr 1)/cluster/init" -H 'content-type: application/json' \
  -d "{\"members\": {\"1\": \"$(addr 1)\", \"2\": \"$(addr 2)\", \"3\": \"$(addr 3)\"}}")
echo "$init"
case $init in
  *'"initialized":true'*) ;;
  *) echo "init failed; stopping" >&2; exit 1 ;;
esac

leader=""
has_leader() {
  leader=$(leader_seen_by 1)
  [ -n "$leader" ] && [ "$leader" != null ]
}
wait_for "a leader" 60 has_leader
echo "leader: node $leader"
follower=$(( leader % 3 + 1 ))

run curl -s -X PUT "$SCHEME://$(addr "$leader")/kv/greeting" --data-binary 'hello, raft'
run curl -s -X PUT "$SCHEME://$(addr "$leader")/kv/colour" --data-binary 'blue'
run curl -s "$SCHEME://$(addr "$leader")/kv/greeting"
say curl -s -i "$SCHEME://$(addr "$follower")/kv/greeting"
curl -s -i "$SCHEME://$(addr "$follower")/kv/greeting" | grep -iE '^(HTTP|location)|error'
run curl -s "${FOLLOW[@]}" "$SCHEME://$(addr "$follower")/kv/colour"
run curl -s -X DELETE "$SCHEME://$(addr "$leader")/kv/colour"
say curl -s -o /dev/null -w '%{http_code}' "$SCHEME://$(addr "$leader")/kv/colour"
curl -s -o /dev/null -w '%{http_code}\n' "$SCHEME://$(addr "$leader")/kv/colour"
say curl -s -X PUT "$SCHEME://$(addr "$leader")/kv/" --data-binary x
curl -s -w ' %{http_code}\n' -X PUT "$SCHEME://$(addr "$leader")/kv/" --data-binary x
if [ "${SECURE:-0}" = 1 ]; then
  say curl without the token: -s -X PUT "$SCHEME://$(addr "$leader")/kv/greeting" --data-binary nope
  command curl -s -w ' %{http_code}\n' --cacert "$TLS/ca.pem" --cert "$TLS/client.pem" \
    --key "$TLS/client-key.pem" -X PUT "$SCHEME://$(addr "$leader")/kv/greeting" --data-binary nope
  run curl -s "$SCHEME://$(addr "$leader")/kv/greeting"
fi

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
run curl -s "$SCHEME://$(addr "$new")/kv/greeting"
run curl -s -X PUT "$SCHEME://$(addr "$new")/kv/after-failover" --data-binary 'still here'

echo "restarting node $leader"
"$BIN" node --id "$leader" --listen "$(addr "$leader")" --dir "$DATA/node-$leader" \
  --heartbeat-ms 100 "${NODE_ARGS[@]}" 2>>"$DATA/node-$leader.log" &
PIDS[leader]=$!
caught_up() {
  [ "$(curl -s -m 2 "$SCHEME://$(addr "$leader")/kv/after-failover?consistency=local")" = "still here" ]
}
wait_for "node $leader to catch up" 60 caught_up
run curl -s "$SCHEME://$(addr "$leader")/kv/after-failover?consistency=local"
run curl -s "$SCHEME://$(addr "$leader")/cluster/metrics"

for id in 1 2 3; do kill "${PIDS[id]}"; done
wait 2>/dev/null || true
PIDS=()
echo "stopped"
