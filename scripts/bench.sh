#!/usr/bin/env bash
# `make bench`: measures mqlet (binary sizes, memory, idle CPU with 25 pods, pod start next to `ctr run`, a burst of 20,
# agent restart, recovery after a simulated power cycle, and the MQTT link: apply over MQTT, the
# idle link's bytes next to a bare paho client's, convergence after a broker outage; and how long a
# pod that drives the node into memory pressure lives on: eviction_ms) and writes bench/results.json.
# BENCHMARKS.md explains every figure.
#
# The measurements run against a private containerd that this script configures and the harness
# (tools/bench, Go) starts, restarts and stops by pid: its own root /var/lib/mqlet-bench/containerd,
# state /run/mqlet-bench/containerd and socket /run/mqlet-bench/containerd.sock. The recovery
# figure kills every task and restarts containerd, which must never happen to the shared test
# containerd of scripts/testenv.sh. That script (a prerequisite: `make bench` runs it first)
# installs containerd and runc and builds the test images. The MQTT figures run mosquitto brokers
# of their own on free loopback ports and count bytes with an iptables chain (MQLET-BENCH, hooked
# into OUTPUT on lo), removed at the end.
#
# Usage: scripts/bench.sh [harness flags...], e.g. -agent-env GODEBUG=gctrace=1 -keep-logs /tmp/bench-logs
# (go run ./tools/bench -h lists them). Must run as root.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LIB_DIR=/var/lib/mqlet-bench
RUN_DIR=/run/mqlet-bench
SOCK=$RUN_DIR/containerd.sock
ENV_FILE=/run/mqlet-test/env

die() {
	echo "bench: ERROR: $*" >&2
	exit 1
}

[ "$(id -u)" = 0 ] || die "must run as root (containerd, runc and network namespaces need it)"
export PATH=/usr/local/go/bin:$PATH
export HOME=${HOME:-/root}
command -v containerd >/dev/null || die "containerd is not installed; run scripts/testenv.sh"
command -v ctr >/dev/null || die "ctr is not installed; run scripts/testenv.sh"
MOSQUITTO=$(command -v mosquitto || echo /usr/sbin/mosquitto)
[ -x "$MOSQUITTO" ] || die "mosquitto is not installed (apt-get install mosquitto; scripts/testenv.sh does)"
IPTABLES=$(command -v iptables || echo /usr/sbin/iptables)
[ -x "$IPTABLES" ] || die "iptables is not installed (apt-get install iptables): the MQTT figures count bytes with it"
[ -s "$ENV_FILE" ] || die "$ENV_FILE is missing; run scripts/testenv.sh"
# shellcheck disable=SC1090
. "$ENV_FILE"
IMAGE_ARCHIVE=${MQLET_TEST_IMAGES:?MQLET_TEST_IMAGES not set in $ENV_FILE}/busybox.tar
[ -s "$IMAGE_ARCHIVE" ] || die "$IMAGE_ARCHIVE is missing; run scripts/testenv.sh"

cd "$REPO_ROOT"
echo "bench: building bin/mqlet and the release binaries (make build cross)" >&2
make --no-print-directory build cross >&2

WORK=$(mktemp -d /tmp/mqlet-bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# shellcheck source=scripts/lib/containerd-config.sh
. "$REPO_ROOT/scripts/lib/containerd-config.sh"
containerd_config scripts/bench.sh "$LIB_DIR" "$RUN_DIR" "$SOCK" >"$WORK/containerd.toml"

go build -o "$WORK/bench" ./tools/bench
go build -o "$WORK/mqttfloor" ./tools/bench/mqttfloor

"$WORK/bench" \
	-containerd "$(command -v containerd)" \
	-containerd-config "$WORK/containerd.toml" \
	-socket "$SOCK" \
	-lib-dir "$LIB_DIR" \
	-run-dir "$RUN_DIR" \
	-mqlet "$REPO_ROOT/bin/mqlet" \
	-ctr "$(command -v ctr)" \
	-bin-dir "$REPO_ROOT/bin" \
	-image-archive "$IMAGE_ARCHIVE" \
	-mosquitto "$MOSQUITTO" \
	-mqtt-floor "$WORK/mqttfloor" \
	-iptables "$IPTABLES" \
	-out "$REPO_ROOT/bench/results.json" \
	"$@"
