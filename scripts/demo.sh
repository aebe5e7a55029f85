#!/usr/bin/env bash
# `make demo`: runs the agent on the test environment's containerd with the example pod from
# configs/pods, shows it running, and leaves it running. `make demo-down` (this script with
# "down") stops the agent by its pid and removes the demo pod.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=bin/mqlet
DEMO=/var/lib/mqlet-demo
RUN=/run/mqlet-demo
SOCK=$RUN/mqlet.sock
PIDFILE=$RUN/agent.pid
# shellcheck disable=SC1091
. /run/mqlet-test/env
export MQLET_CONTAINERD_ADDRESS=$MQLET_TEST_CONTAINERD MQLET_CONTAINERD_NAMESPACE=mqlet-demo MQLET_API_SOCKET=$SOCK

running() { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

if [ "${1:-}" = down ]; then
  rm -f "$DEMO/pods/hello.yaml"
  if running; then
    # Give the agent a moment to stop the pod it no longer has a manifest for, then stop it.
    for _ in $(seq 1 100); do
      "$BIN" pods 2>/dev/null | grep -q hello || break
      sleep 0.1
    done
    kill "$(cat "$PIDFILE")"
    echo "demo agent stopped"
  fi
  rm -f "$PIDFILE"
  exit 0
fi

mkdir -p "$DEMO/pods" "$DEMO/images" "$RUN"
# The image arrives the way it would on an offline node: an archive in the preload dir.
cp -u /var/lib/mqlet-test/images/busybox.tar "$DEMO/images/busybox.tar"
cp configs/pods/hello.yaml "$DEMO/pods/hello.yaml"

if running; then
  echo "demo agent already running (pid $(cat "$PIDFILE"))"
else
  nohup "$BIN" agent --node-name "$(hostname | tr 'A-Z' 'a-z')" --state-dir "$DEMO/state" \
    --manifest-dir "$DEMO/pods" --image-preload-dir "$DEMO/images" >"$DEMO/agent.log" 2>&1 &
  echo $! >"$PIDFILE"
  echo "demo agent started (pid $!, log $DEMO/agent.log)"
fi

for _ in $(seq 1 300); do
  if "$BIN" pods 2>/dev/null | grep -q 'hello .*2/2 .*Running'; then
    break
  fi
  running || { echo "agent exited:"; cat "$DEMO/agent.log"; exit 1; }
  sleep 0.1
done
sleep 1
echo
echo "\$ mqlet pods -o wide"
"$BIN" pods -o wide
"$BIN" pods | grep -q 'hello .*2/2 .*Running' || { echo "the demo pod is not running"; tail -20 "$DEMO/agent.log"; exit 1; }
echo
echo "\$ mqlet describe pod hello"
"$BIN" describe pod hello
echo
sleep 1
echo "\$ mqlet logs hello -c poller"
"$BIN" logs hello -c poller | tail -3
echo
echo "The agent keeps running. Try: MQLET_API_SOCKET=$SOCK $BIN pods;  stop it with: make demo-down"
