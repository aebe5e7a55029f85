#!/usr/bin/env bash
# `make bench-fleet`: mqlet-bridge holding 1,000 simulated nodes and 10,000 pods on a real control
# plane on this machine (etcd, kube-apiserver, kube-controller-manager, kube-scheduler from
# internal/kubetest; mosquitto with configs/mosquitto/fleet-sim.conf; mqlet-fleetsim). The
# harness is tools/benchfleet (Go); it writes bench/fleet-results.json and prints the figures.
# BENCHMARKS.md ("After issue 13: the fleet") says what each one means.
#
# Usage: scripts/bench-fleet.sh [harness flags...], e.g. -keep-logs /tmp/fleet-logs
# -bridge-flag=--kube-api-qps=400 (go run ./tools/benchfleet -h lists them).
# Needs: mosquitto, Debian's etcd-server, and the kube binaries of scripts/kubebins.sh
# (MQLET_TEST_KUBE_BIN, else /run/mqlet-test/env, else /var/lib/mqlet-test/kube/<version>/bin).
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
die() {
	echo "bench-fleet: ERROR: $*" >&2
	exit 1
}
export PATH=/usr/local/go/bin:$PATH
MOSQUITTO=$(command -v mosquitto || echo /usr/sbin/mosquitto)
[ -x "$MOSQUITTO" ] || die "mosquitto is not installed (apt-get install mosquitto)"
command -v etcd >/dev/null || die "etcd is not installed (apt-get install etcd-server)"

cd "$REPO_ROOT"
echo "bench-fleet: building bin/mqlet, bin/mqlet-bridge and bin/mqlet-fleetsim (make build)" >&2
make --no-print-directory build >&2
WORK=$(mktemp -d /tmp/mqlet-bench-fleet.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
go build -o "$WORK/benchfleet" ./tools/benchfleet

"$WORK/benchfleet" \
	-fleetsim "$REPO_ROOT/bin/mqlet-fleetsim" \
	-bridge "$REPO_ROOT/bin/mqlet-bridge" \
	-mosquitto "$MOSQUITTO" \
	-mosquitto-conf "$REPO_ROOT/configs/mosquitto/fleet-sim.conf" \
	-rbac "$REPO_ROOT/configs/bridge/rbac.yaml" \
	-out "$REPO_ROOT/bench/fleet-results.json" \
	"$@"
