#!/usr/bin/env bash
# The arm release binaries under qemu-user (Debian's qemu-user-static), run explicitly through the
# emulator so the host needs no binfmt_misc registration: `make cross` builds the three release
# binaries; the arm64 and armv7 ones must print their version, their agent help, and refuse a
# config with an unknown key; agent/config's tests, built for each arm target, load and check the
# shipped configs/mqlet.yaml there. Nothing here touches containerd, cgroups or a service.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
export PATH=/usr/local/go/bin:$PATH

log() { echo "test-arm: $*" >&2; }
failed=()
fail() {
	echo "test-arm: FAIL: $*" >&2
	failed+=("$*")
}

# Without its recommends (binfmt-support), installing qemu-user-static registers no binfmt handler:
# it changes nothing on the host but files.
if ! command -v qemu-aarch64-static >/dev/null || ! command -v qemu-arm-static >/dev/null; then
	log "installing: qemu-user-static"
	{ apt-get -o DPkg::Lock::Timeout=300 update -q >/dev/null &&
		apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends qemu-user-static >/dev/null; } ||
		{ echo "test-arm: ERROR: apt-get install qemu-user-static failed" >&2; exit 1; }
fi
tmp=$(mktemp -d /tmp/mqlet-arm.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

t0=$(date +%s)
make -s -C "$REPO" cross >/dev/null
# A typo in a key must stop the agent before it does anything (the config is validated first).
printf 'stateDir: %s/state\nnoSuchKey: 1\n' "$tmp" >"$tmp/bad.yaml"

# name GOARCH GOARM emulator file(1) machine
for target in "arm64 arm64 '' qemu-aarch64-static aarch64" "armv7 arm 7 qemu-arm-static ARM,"; do
	eval "set -- $target"
	name=$1 goarch=$2 goarm=$3 emu=$4 machine=$5
	bin=$REPO/bin/mqlet-linux-$name
	t1=$(date +%s)
	desc=$(file -b "$bin")
	case $desc in
	*"$machine"*"statically linked"*) ;;
	*) fail "$bin is not a static $machine binary: $desc" ;;
	esac
	out=$(timeout 120 $emu "$bin" version 2>&1) || fail "$name: mqlet version exited $?: $out"
	echo "$name: mqlet version: $out"
	case $out in *"$(git -C "$REPO" rev-parse --short HEAD)"*) ;; *) fail "$name: version output names no commit of this checkout: $out" ;; esac
	out=$(timeout 120 $emu "$bin" agent --help 2>&1) || fail "$name: mqlet agent --help exited $?"
	grep -q -- '--config' <<<"$out" || fail "$name: mqlet agent --help does not list --config"
	if out=$(timeout 120 $emu "$bin" agent --config "$tmp/bad.yaml" 2>&1); then
		fail "$name: mqlet agent accepted a config with an unknown key"
	fi
	grep -q noSuchKey <<<"$out" || fail "$name: the refusal of bad.yaml does not name the key: $out"
	echo "$name: bad config refused: $(head -c 200 <<<"$out")"
	# From the package's directory: TestExampleConfigLoads reads ../../configs/mqlet.yaml.
	GOOS=linux GOARCH=$goarch GOARM=$goarm CGO_ENABLED=0 go test -c -o "$tmp/config-$name.test" "$REPO/agent/config"
	if ! out=$(cd "$REPO/agent/config" && timeout 600 $emu "$tmp/config-$name.test" -test.count=1 -test.v 2>&1); then
		fail "$name: agent/config tests failed"
		echo "$out" | tail -n 40
	fi
	grep -q -- '--- PASS: TestExampleConfigLoads ' <<<"$out" || fail "$name: TestExampleConfigLoads did not pass"
	echo "$name: agent/config tests: $(grep -c -- '--- PASS' <<<"$out") passed, $(grep -c -- '--- FAIL' <<<"$out") failed ($(($(date +%s) - t1))s)"
done
log "done in $(($(date +%s) - t0))s"
if [ ${#failed[@]} -gt 0 ]; then
	printf 'test-arm: FAIL: %s\n' "${failed[@]}" >&2
	exit 1
fi
echo "test-arm: PASS"
