#!/usr/bin/env bash
# Runs the conformance suite against a freshly started gateway binary on
# loopback, with a real restart (kill and start again on the same folder).
#   .ci/conformance.sh            run the whole suite
#   .ci/conformance.sh cluster    the same against a follower of three
#                                 clustered nodes; a restart kills the
#                                 leader (kill -9) and starts it again,
#                                 so the suite's state must survive a
#                                 failover
#   .ci/conformance.sh edge       the same through a hub: the suite's URL is
#                                 the hub's /edge/edge/, which passes every
#                                 connection on to an edge box linked to it
#                                 as a NATS leaf node; a restart kills the
#                                 edge box (kill -9) and starts it again
#   .ci/conformance.sh restart    (used by the suite) restart the server
set -euo pipefail
cd "$(dirname "$0")/.."
state=${GATEHOUSE_CONFORMANCE_STATE:-$(mktemp -d)}
export GATEHOUSE_CONFORMANCE_STATE=$state
bin=$state/gatehouse
addr=127.0.0.1:${GATEHOUSE_CONFORMANCE_PORT:-18765}
secret=conformance-secret-0123456789abcdef

mode=${GATEHOUSE_CONFORMANCE_MODE:-single}
[ "${1:-}" = cluster ] && mode=cluster
[ "${1:-}" = edge ] && mode=edge
export GATEHOUSE_CONFORMANCE_MODE=$mode
port=${GATEHOUSE_CONFORMANCE_PORT:-18765}
routes="127.0.0.1:$((port + 11)),127.0.0.1:$((port + 12)),127.0.0.1:$((port + 13))"

leaf=127.0.0.1:$((port + 20))

# serve starts node $1 (0: the single node, or the edge box; 4: the hub)
# in the background.
serve() {
  local flags=() at=$addr data=$state/data
  if [ "$mode" = edge ] && [ "$1" = 0 ]; then
    flags=(--node-name edge --nats-domain edge --leaf-remote "nats-leaf://$leaf")
  elif [ "$1" = 4 ]; then
    at=127.0.0.1:$((port + 4)) data=$state/hub
    flags=(--node-name hub --leaf-listen "$leaf")
  elif [ "$1" != 0 ]; then
    at=127.0.0.1:$((port + $1)) data=$state/n$1
    flags=(--cluster-name conformance --node-name "n$1" --cluster-listen "127.0.0.1:$((port + 10 + $1))"
      --cluster-peers "$routes" --cluster-election-timeout 1s)
  fi
  "$bin" serve --addr "$at" --data "$data" --policy .ci/conformance-policy.yaml \
    --jwt-secret "$secret" --jwt-issuer ci --jwt-audience gatehouse --token admin-token \
    --write-timeout 2s --log-level warn "${flags[@]}" >>"$state/server$1.log" 2>&1 &
  echo $! >"$state/pid$1"
}

# ready waits until $1 answers /v0/ready.
ready() {
  for _ in $(seq 1 600); do
    curl -fsS "$1/v0/ready" >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  echo "gateway $1 did not become ready" >&2
  cat "$state"/server*.log >&2
  return 1
}

# leader prints the number of the node that leads.
leader() {
  for i in 1 2 3; do
    if curl -fsS -H "Authorization: Bearer admin-token" "http://127.0.0.1:$((port + i))/v0/cluster" 2>/dev/null | grep -q '"role":"leader"'; then
      echo "$i"
      return 0
    fi
  done
  return 1
}

start() {
  if [ "$mode" = single ]; then
    serve 0
    ready "http://$addr"
    return
  fi
  if [ "$mode" = edge ]; then
    [ -f "$state/pid4" ] || { serve 4; ready "http://127.0.0.1:$((port + 4))"; }
    serve 0
    ready "http://$addr"
    # Through the hub, once the box has linked to it.
    ready "http://127.0.0.1:$((port + 4))/edge/edge"
    return
  fi
  for i in 1 2 3; do [ -f "$state/pid$i" ] || serve "$i"; done
  for i in 1 2 3; do ready "http://127.0.0.1:$((port + i))"; done
}

# stop_node stops node $1 with signal $2.
stop_node() {
  local f=$state/pid$1
  if [ -f "$f" ]; then
    kill "-$2" "$(cat "$f")" 2>/dev/null || true
    for _ in $(seq 1 200); do kill -0 "$(cat "$f")" 2>/dev/null || break; sleep 0.05; done
    rm -f "$f"
  fi
}

stop_server() {
  for i in 0 1 2 3 4; do stop_node "$i" TERM; done
}

stop() {
  if [ -f "$state/agent.pid" ]; then
    kill "$(cat "$state/agent.pid")" 2>/dev/null || true
    rm -f "$state/agent.pid"
  fi
  stop_server
}

if [ "${1:-}" = restart ]; then
  # Only the server restarts; the example agent reconnects by itself. In
  # a cluster the leader is killed and started again: another node takes
  # over, and the suite reaches it through the same follower.
  case $mode in
  single) stop_server ;;
  edge) stop_node 0 KILL ;;
  *) stop_node "$(leader)" KILL ;;
  esac
  start
  exit 0
fi

go build -o "$bin" ./cmd/gatehouse
trap 'stop; rm -rf "$state"' EXIT
start
base=http://$addr
if [ "$mode" = cluster ]; then
  # The suite talks to a follower: every request crosses the relay.
  for _ in $(seq 1 200); do l=$(leader) && break; sleep 0.1; done
  base=http://127.0.0.1:$((port + l % 3 + 1))
fi
if [ "$mode" = edge ]; then
  # The suite talks to the hub: every connection crosses the leaf link.
  base=http://127.0.0.1:$((port + 4))/edge/edge
fi
# The example AAP agent, for the suite's --aap-agent check.
"$bin" agent --url "$base" --token admin-token --name example --log-level warn >>"$state/agent.log" 2>&1 &
echo $! >"$state/agent.pid"
token() { "$bin" token --secret "$secret" --iss ci --aud gatehouse --sub "$1" --role "$2" "${@:3}"; }
"$bin" conformance --url "$base" --token admin-token \
  --restart-cmd "$0 restart" --approval-tool conformance.approve \
  --runner-token "$(token ci-runner runner --runners ci-runner)" --runner-token-id ci-runner \
  --agent-token "$(token ci-agent agent --agents ci-agent)" --agent-token-id ci-agent \
  --client-token "$(token ci-alice client)" --other-client-token "$(token ci-bob client)" \
  --aap-agent example
