#!/usr/bin/env bash
# Runs the conformance suite against a freshly started gateway binary on
# loopback, with a real restart (kill and start again on the same folder).
#   .ci/conformance.sh            run the whole suite
#   .ci/conformance.sh restart    (used by the suite) restart the server
set -euo pipefail
cd "$(dirname "$0")/.."
state=${GATEHOUSE_CONFORMANCE_STATE:-$(mktemp -d)}
export GATEHOUSE_CONFORMANCE_STATE=$state
bin=$state/gatehouse
addr=127.0.0.1:${GATEHOUSE_CONFORMANCE_PORT:-18765}
secret=conformance-secret-0123456789abcdef

start() {
  "$bin" serve --addr "$addr" --data "$state/data" --policy .ci/conformance-policy.yaml \
    --jwt-secret "$secret" --jwt-issuer ci --jwt-audience gatehouse --token admin-token \
    --write-timeout 2s --log-level warn >>"$state/server.log" 2>&1 &
  echo $! >"$state/pid"
  for _ in $(seq 1 200); do
    curl -fsS "http://$addr/v0/ready" >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  echo "gateway did not become ready" >&2
  cat "$state/server.log" >&2
  return 1
}

stop_server() {
  if [ -f "$state/pid" ]; then
    kill "$(cat "$state/pid")" 2>/dev/null || true
    for _ in $(seq 1 200); do kill -0 "$(cat "$state/pid")" 2>/dev/null || break; sleep 0.05; done
    rm -f "$state/pid"
  fi
}

stop() {
  if [ -f "$state/agent.pid" ]; then
    kill "$(cat "$state/agent.pid")" 2>/dev/null || true
    rm -f "$state/agent.pid"
  fi
  stop_server
}

if [ "${1:-}" = restart ]; then
  # Only the server restarts; the example agent reconnects by itself.
  stop_server
  start
  exit 0
fi

go build -o "$bin" ./cmd/gatehouse
trap 'stop; rm -rf "$state"' EXIT
start
# The example AAP agent, for the suite's --aap-agent check.
"$bin" agent --url "http://$addr" --token admin-token --name example --log-level warn >>"$state/agent.log" 2>&1 &
echo $! >"$state/agent.pid"
token() { "$bin" token --secret "$secret" --iss ci --aud gatehouse --sub "$1" --role "$2" "${@:3}"; }
"$bin" conformance --url "http://$addr" --token admin-token \
  --restart-cmd "$0 restart" --approval-tool conformance.approve \
  --runner-token "$(token ci-runner runner --runners ci-runner)" --runner-token-id ci-runner \
  --agent-token "$(token ci-agent agent --agents ci-agent)" --agent-token-id ci-agent \
  --client-token "$(token ci-alice client)" --other-client-token "$(token ci-bob client)" \
  --aap-agent example
