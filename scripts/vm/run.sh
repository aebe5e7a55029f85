#!/usr/bin/env bash
# `make test-vm`: mqlet's cgroup v2 lane. Boots the cached Debian 12 guest (scripts/vm/image.sh
# builds it on first use) with systemd as PID 1 and cgroup v2 only, and runs scripts/vm/guest.sh
# in it as root: agent/cgroup's tests against the real v2 hierarchy, and the example pod started
# by the shipped systemd unit on Debian's containerd. Prints the guest's log and exits non-zero
# when anything failed. See docs/testing.md for what it needs and costs.
#
# The test binaries are built here (CGO_ENABLED=0), not in the guest: compiling under TCG is ~100x
# slower. The guest sees the checkout read-only and a per-run directory (binaries in, results out)
# over virtio-9p; its only network is qemu's user-mode one with restrict=on (no egress) and one
# forwarded port (127.0.0.1:<free port> -> the guest's ssh) for looking around with
# MQLET_VM_KEEP=1. The disk is opened with snapshot=on: a run never changes the cached image.
#
# Environment: MQLET_VM_TIMEOUT  seconds the guest may run before it is killed (default 1800)
#              MQLET_VM_ACCEL    kvm or tcg (default: kvm only if a probe guest boots under it)
#              MQLET_VM_KEEP=1   keep the run directory (logs, console) even when the run passed
#              MQLET_VM_SHELL=1  boot without running the tests (kernel argument mqlet.lane=0) and
#                                print the ssh command; the guest runs until powered off or timed out
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
TIMEOUT=${MQLET_VM_TIMEOUT:-1800}
MEM=1536
CPUS=2 # this machine's cores are shared; never more
export PATH=/usr/local/go/bin:$PATH

log() { echo "test-vm: $*" >&2; }
die() {
	echo "test-vm: ERROR: $*" >&2
	exit 1
}
now() { date +%s; }

[ "$(id -u)" = 0 ] || die "must run as root (the image build and the guest's shares need it)"
command -v go >/dev/null || die "go not found"

# Debian's packages the lane needs on the host. None of them has a service, so installing them
# starts and changes nothing on the host.
missing=()
command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
command -v mkfs.ext4 >/dev/null || missing+=(e2fsprogs)
command -v ssh-keygen >/dev/null || missing+=(openssh-client)
command -v file >/dev/null || missing+=(file)
# The test image is made from a static busybox (tools/mkimage), as testenv.sh makes its own.
dpkg -s busybox-static 2>/dev/null | grep -q '^Status: install ok installed' || missing+=(busybox-static)
if [ ${#missing[@]} -gt 0 ]; then
	log "installing: ${missing[*]}"
	{ apt-get -o DPkg::Lock::Timeout=300 update -q >/dev/null &&
		apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends "${missing[@]}" >/dev/null; } ||
		die "apt-get install ${missing[*]} failed"
fi
file -L /bin/busybox | grep -q 'statically linked' || die "/bin/busybox is not a static binary (the test image needs one)"

t0=$(now)
IMAGE=$(bash "$HERE/image.sh")
t_image=$(($(now) - t0))

run=$(mktemp -d /tmp/mqlet-vm.XXXXXX)
qemu_pid=
cleanup() {
	local rc=$?
	if [ -n "$qemu_pid" ] && kill -0 "$qemu_pid" 2>/dev/null; then
		kill "$qemu_pid" 2>/dev/null
		sleep 1
		kill -9 "$qemu_pid" 2>/dev/null || true
	fi
	if [ $rc = 0 ] && [ "${MQLET_VM_KEEP:-}" != 1 ]; then
		rm -rf "$run"
	else
		log "run directory kept: $run (guest.log, console.log)"
	fi
}
trap cleanup EXIT
mkdir -p "$run/bin" "$run/images"

# build_debs makes two .debs of the checkout (0.0.1~lane and 0.0.2~lane, amd64) into $1, for
# guest.sh's package steps: install, upgrade, rollback, purge. Only the stamped version differs.
build_debs() {
	local out=$1 v
	for v in 1 2; do
		mkdir -p "$out/bin-$v"
		CGO_ENABLED=0 go build -trimpath -tags grpcnotrace -ldflags "-s -w -X main.stampedVersion=v0.0.$v-lane -X main.stampedCommit=lane" \
			-o "$out/bin-$v/mqlet-linux-amd64" ./cmd/mqlet
		(cd tools/release && go run . -version "v0.0.$v-lane" -repo ../.. -bin "$out/bin-$v" -out "$out" -arch amd64 -only deb >/dev/null)
		rm -rf "$out/bin-$v"
	done
}

t1=$(now)
log "building the test binaries on the host"
(
	cd "$REPO"
	CGO_ENABLED=0 go test -c -o "$run/bin/cgroup.test" ./agent/cgroup
	CGO_ENABLED=0 go test -c -o "$run/bin/eviction.test" ./agent/eviction
	CGO_ENABLED=0 go build -trimpath -tags grpcnotrace -o "$run/bin/mqlet" ./cmd/mqlet
	go run ./tools/mkimage -busybox /bin/busybox -out "$run/images" >/dev/null
	build_debs "$run/debs"
)
t_build=$(($(now) - t1))

# KVM only when a guest really runs under it: where /dev/kvm is not hardware KVM (KVM-PVM seen
# here: KVM_CREATE_VM succeeds, Debian's kernel never boots) opening the device proves nothing.
# The probe boots the guest kernel with no root file system; under working KVM it panics
# ("VFS: Unable to mount root fs") within seconds and qemu exits (-no-reboot, panic=-1).
pick_accel() {
	case ${MQLET_VM_ACCEL:-} in
	kvm | tcg)
		echo "$MQLET_VM_ACCEL"
		return
		;;
	esac
	if [ -c /dev/kvm ] && grep -qwE 'vmx|svm' /proc/cpuinfo; then
		timeout -s KILL 30 qemu-system-x86_64 -accel kvm -cpu host -m 256 -nodefaults -display none \
			-no-reboot -kernel "$IMAGE/vmlinuz" -append "console=ttyS0 panic=-1" \
			-serial "file:$run/kvm-probe.log" >/dev/null 2>&1 || true
		if grep -q 'Kernel panic' "$run/kvm-probe.log" 2>/dev/null; then
			echo kvm
			return
		fi
		log "/dev/kvm is there but a probe guest did not boot under it; using TCG"
	fi
	echo tcg
}
accel=$(pick_accel)
case $accel in
kvm) accel_args=(-accel kvm -cpu host) ;;
*) accel_args=(-accel tcg,thread=multi -cpu max) ;;
esac
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

# A shared lock for the guest's lifetime: image.sh removes an outdated image only under the
# exclusive one.
exec 9<"$(dirname "$IMAGE")/lock"
flock -s 9

append="root=/dev/vda rw console=ttyS0 panic=-1 systemd.unified_cgroup_hierarchy=1 cgroup_no_v1=all"
[ "${MQLET_VM_SHELL:-}" = 1 ] && append+=" mqlet.lane=0"
log "booting $(basename "$IMAGE") ($(cat "$IMAGE/kernel-version"), $accel, $CPUS vCPUs, ${MEM}M; ssh on 127.0.0.1:$port; timeout ${TIMEOUT}s)"
t2=$(now)
nice -n 10 qemu-system-x86_64 -name mqlet-v2-lane -machine q35 "${accel_args[@]}" -smp $CPUS -m $MEM \
	-nodefaults -display none -no-reboot \
	-serial "file:$run/console.log" \
	-kernel "$IMAGE/vmlinuz" -initrd "$IMAGE/initrd.img" \
	-append "$append" \
	-drive "file=$IMAGE/rootfs.img,format=raw,if=virtio,snapshot=on" \
	-netdev "user,id=net0,restrict=on,hostfwd=tcp:127.0.0.1:$port-:22" -device virtio-net-pci,netdev=net0 \
	-fsdev "local,id=src,path=$REPO,security_model=none,readonly=on" -device virtio-9p-pci,fsdev=src,mount_tag=src \
	-fsdev "local,id=out,path=$run,security_model=none" -device virtio-9p-pci,fsdev=out,mount_tag=out \
	>"$run/qemu.log" 2>&1 &
qemu_pid=$!
if [ "${MQLET_VM_SHELL:-}" = 1 ]; then
	log "no tests (MQLET_VM_SHELL=1); once booted: ssh -i $IMAGE/id_ed25519 -p $port -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null root@127.0.0.1"
fi

timed_out=0
while kill -0 "$qemu_pid" 2>/dev/null; do
	if [ $(($(now) - t2)) -ge "$TIMEOUT" ]; then
		log "the guest ran longer than ${TIMEOUT}s: killing qemu (pid $qemu_pid)"
		kill "$qemu_pid"
		timed_out=1
		break
	fi
	sleep 1
done
qemu_rc=0
wait "$qemu_pid" || qemu_rc=$?
qemu_pid=
t_guest=$(($(now) - t2))

if [ "${MQLET_VM_SHELL:-}" = 1 ]; then
	log "guest ended after ${t_guest}s (qemu exit $qemu_rc)"
	exit 0
fi
if [ -f "$run/guest.log" ]; then
	echo "----- guest.log (scripts/vm/guest.sh in the guest)"
	cat "$run/guest.log"
fi
rc=$(cat "$run/rc" 2>/dev/null || echo none)
if [ "$rc" != 0 ]; then
	echo "----- console.log (last 60 lines)"
	tail -n 60 "$run/console.log" 2>/dev/null || true
	cat "$run/qemu.log" 2>/dev/null || true
fi
boot=$(sed -n 's/^=== the guest: .*, \([0-9.]*\)s since boot)$/\1/p' "$run/guest.log" 2>/dev/null | head -1 || true)
echo "test-vm: image ${t_image}s, host build ${t_build}s, guest ${t_guest}s (${accel}; guest.sh started ${boot:-?}s after boot), total $(($(now) - t0))s"
[ $timed_out = 0 ] || die "timed out after ${TIMEOUT}s"
[ "$qemu_rc" = 0 ] || die "qemu exited $qemu_rc"
[ "$rc" = 0 ] || die "guest.sh exit code: $rc"
echo "test-vm: PASS"
