#!/usr/bin/env bash
# `make conformance`: Kubernetes' own sig-node conformance specs against mqlet-bridge and one mqlet
# node, result in docs/conformance.md (docs/testing.md, "The conformance lane").
#
#   1. scripts/conformance-bins.sh     e2e.test and ginkgo at the control plane's version (cached
#                                      under /var/lib/mqlet-test/conformance/<version>/bin)
#   2. scripts/conformance-images.sh   agnhost, busybox, nonroot, pause into the test registry and
#                                      the KUBE_TEST_REPO_LIST file naming them
#   3. tools/conformance               a private control plane, mosquitto, mqlet-bridge and one
#                                      `mqlet agent`; ginkgo on e2e.test; docs/conformance.md
#
# Everything runs under `nice -n 19`. The whole lane is not part of `make test` or CI: a clean
# build of e2e.test takes half an hour on a loaded 2-core machine and the run as long again. Its
# CI subset is (-ci, `make conformance-ci`, which `make test` runs).
#
# Usage: scripts/conformance.sh [-ci] [-procs N] [-focus RE] [-skip RE] [-keep DIR] [-start-only]
#   -ci           the CI subset: the specs tools/conformance/ci-specs.txt lists, on the smaller
#                 suite binary `conformance-bins.sh --ci` builds; fails unless every one ran and
#                 passed; writes no report
#   -procs N      ginkgo processes (default 2)
#   -focus/-skip  ginkgo regexps (default '\[sig-node\].*\[Conformance\]' and '\[Serial\]|\[Disruptive\]')
#   -keep DIR     copy ginkgo's output, the agent's and the bridge's logs and junit.xml to DIR
#   -start-only   build nothing, start the world, wait for the node to be Ready, stop (no suite,
#                 no report): checks the start-up and measures it
# Needs scripts/testenv.sh's environment (containerd, registry, kube binaries).
set -euo pipefail
export PATH=/usr/local/go/bin:$PATH
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
die() {
	echo "conformance: ERROR: $*" >&2
	exit 1
}
[ -f /run/mqlet-test/env ] || die "no /run/mqlet-test/env: run scripts/testenv.sh (make testenv) first"
set -a
# shellcheck disable=SC1091
. /run/mqlet-test/env
set +a

ARGS=()
BINS_ARGS=()
START_ONLY=0
REPORT=$REPO_ROOT/docs/conformance.md
GO_TIMEOUT=150m
while [ $# -gt 0 ]; do
	case $1 in
	-ci)
		# ginkgo's --timeout for the 17 specs (about 3 minutes with 2 processes): a hang fails
		# CI in 15 minutes, not 100.
		BINS_ARGS+=(--ci)
		ARGS+=(-conformance.specs="$REPO_ROOT/tools/conformance/ci-specs.txt" -conformance.strict -conformance.timeout=15m)
		REPORT=
		GO_TIMEOUT=30m
		shift
		;;
	-procs | -focus | -skip | -keep)
		[ $# -ge 2 ] || die "$1 needs a value"
		ARGS+=("-conformance.${1#-}=$2")
		shift 2
		;;
	-start-only)
		ARGS+=(-conformance.start-only)
		REPORT=
		START_ONLY=1
		shift
		;;
	*) die "unknown argument $1 (see the usage at the top of $0)" ;;
	esac
done

START=$SECONDS
BIN= LIST=
if [ $START_ONLY = 0 ]; then
	BIN=$(nice -n 19 "$REPO_ROOT/scripts/conformance-bins.sh" "${BINS_ARGS[@]}")
	echo "conformance: e2e.test and ginkgo in $BIN ($((SECONDS - START))s)" >&2
	T=$SECONDS
	LIST=$(nice -n 19 "$REPO_ROOT/scripts/conformance-images.sh")
	echo "conformance: images pushed, repo list $LIST ($((SECONDS - T))s)" >&2
fi

cd "$REPO_ROOT"
# The harness is a test only to reuse internal/kubetest, mqtttest and testenv (they clean up
# through testing.TB); the build tag keeps it out of `go test ./...`. -timeout covers the start,
# the suite (ginkgo's own --timeout, 100m; 15m with -ci) and the clean-up.
MQLET_TEST_REQUIRE=1 nice -n 19 go test -tags conformance -count=1 -timeout "$GO_TIMEOUT" -v -run '^TestConformance$' \
	./tools/conformance/ -args -conformance.bin-dir="$BIN" -conformance.repo-list="$LIST" \
	-conformance.report="$REPORT" "${ARGS[@]}"
echo "conformance: done in $((SECONDS - START))s${REPORT:+; result in $REPORT}" >&2
