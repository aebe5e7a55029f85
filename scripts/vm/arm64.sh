#!/usr/bin/env bash
# `make test-vm-arm64`: one pod on a full arm64 machine. Boots the cached arm64 Debian 12 guest
# (scripts/vm/arm64-image.sh builds it on first use) under qemu-system-aarch64 TCG (-M virt,
# direct boot of Debian's arm64 kernel and initrd), with systemd as PID 1, cgroup v2 only and
# Debian's containerd + runc, and runs scripts/vm/arm64-guest.sh in it over ssh: the arm64 mqlet
# built here under the shipped unit starts configs/pods/hello.yaml from the manifest dir with the
# arm64 busybox test image. Prints the time of each phase; exits non-zero on any failure.
# See docs/testing.md for what it needs and costs.
#
# The guest sees a per-run directory (the arm64 mqlet, the test image, the checkout's configs)
# read-only over virtio-9p; its only network is qemu's user-mode one with restrict=on (no
# egress) and one forwarded port, 127.0.0.1:<free port> -> the guest's ssh. The disk is opened
# with snapshot=on: a run never changes the cached image. qemu runs under nice and is stopped by
# its pid, at the end or after MQLET_VM_TIMEOUT seconds.
#
# Environment: MQLET_VM_TIMEOUT  seconds the guest may run before it is killed (default 1800)
#              MQLET_VM_KEEP=1   keep the run directory (console.log, qemu.log)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
TIMEOUT=${MQLET_VM_TIMEOUT:-1800}
MEM=1536
CPUS=2 # this machine's cores are shared; never more
export PATH=/usr/local/go/bin:$PATH

log() { echo "test-vm-arm64: $*" >&2; }
die() {
	echo "test-vm-arm64: ERROR: $*" >&2
	exit 1
}
now() { date +%s; }

[ "$(id -u)" = 0 ] || die "must run as root (the image build and the guest's shares need it)"
command -v go >/dev/null || die "go not found"

# Debian's packages the run needs on the host; none has a service. qemu-user-static without its
# recommends (binfmt-support) registers no binfmt handler on the host.
missing=()
command -v qemu-system-aarch64 >/dev/null || missing+=(qemu-system-arm)
command -v qemu-aarch64-static >/dev/null || missing+=(qemu-user-static)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
command -v arch-test >/dev/null || missing+=(arch-test)
command -v mkfs.ext4 >/dev/null || missing+=(e2fsprogs)
command -v ssh >/dev/null || missing+=(openssh-client)
if [ ${#missing[@]} -gt 0 ]; then
	log "installing: ${missing[*]}"
	{ apt-get -o DPkg::Lock::Timeout=300 update -q >/dev/null &&
		apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends "${missing[@]}" >/dev/null; } ||
		die "apt-get install ${missing[*]} failed"
fi

t0=$(now)
IMAGE=$(bash "$HERE/arm64-image.sh")
t_image=$(($(now) - t0))

run=$(mktemp -d /tmp/mqlet-vm-arm64.XXXXXX)
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
		log "run directory kept: $run (console.log, qemu.log)"
	fi
}
trap cleanup EXIT
mkdir -p "$run/bin" "$run/images" "$run/configs/pods"

t1=$(now)
log "building the arm64 mqlet and the arm64 busybox test image on the host"
(
	cd "$REPO"
	CGO_ENABLED=0 GOOS=linux GOARCH=arm64 go build -trimpath -tags grpcnotrace -o "$run/bin/mqlet" ./cmd/mqlet
	CGO_ENABLED=0 go build -o "$run/mkimage" ./scripts/mkimage
	cp configs/mqlet.service configs/mqlet.yaml "$run/configs/"
	cp configs/pods/hello.yaml "$run/configs/pods/"
)
# mkimage runs `busybox --list`: the arm64 busybox runs through qemu-user in arm64-image.sh's
# private binfmt namespace.
bash "$HERE/arm64-image.sh" --exec "$run/mkimage" -busybox "$IMAGE/busybox" -arch arm64 -out "$run/images" >/dev/null
rm -f "$run/mkimage"
t_build=$(($(now) - t1))

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
ssh_cmd=(ssh -i "$IMAGE/id_ed25519" -p "$port" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null
	-o LogLevel=ERROR -o ConnectTimeout=10 -o BatchMode=yes root@127.0.0.1)

# A shared lock for the guest's lifetime: arm64-image.sh removes an outdated image only under the
# exclusive one.
exec 9<"$(dirname "$IMAGE")/lock-arm64"
flock -s 9

# mqlet.lane=0: the image's lane unit (customize.sh, the amd64 lane's guest.sh) stays off; this
# run drives the guest over ssh instead. pauth-impdef: the same pointer authentication with
# QEMU's cheap hash instead of the architected QARMA, several times faster under TCG.
append="root=/dev/vda rw console=ttyAMA0 panic=-1 systemd.unified_cgroup_hierarchy=1 cgroup_no_v1=all mqlet.lane=0"
log "booting $(basename "$IMAGE") ($(cat "$IMAGE/kernel-version"), TCG, $CPUS vCPUs, ${MEM}M; ssh on 127.0.0.1:$port; timeout ${TIMEOUT}s)"
t2=$(now)
nice -n 10 qemu-system-aarch64 -name mqlet-arm64-lane -machine virt -accel tcg,thread=multi \
	-cpu max,pauth-impdef=on -smp $CPUS -m $MEM \
	-nodefaults -display none -no-reboot \
	-serial "file:$run/console.log" \
	-kernel "$IMAGE/vmlinuz" -initrd "$IMAGE/initrd.img" -append "$append" \
	-drive "file=$IMAGE/rootfs.img,format=raw,if=none,id=root,snapshot=on" -device virtio-blk-pci,drive=root \
	-netdev "user,id=net0,restrict=on,hostfwd=tcp:127.0.0.1:$port-:22" -device virtio-net-pci,netdev=net0 \
	-fsdev "local,id=out,path=$run,security_model=none,readonly=on" -device virtio-9p-pci,fsdev=out,mount_tag=out \
	>"$run/qemu.log" 2>&1 &
qemu_pid=$!

# Boot: until root's ssh answers (or qemu dies, or the timeout).
booted=0
while kill -0 "$qemu_pid" 2>/dev/null && [ $(($(now) - t2)) -lt "$TIMEOUT" ]; do
	if timeout 30 "${ssh_cmd[@]}" true 2>/dev/null; then
		booted=1
		break
	fi
	sleep 5
done
t_boot=$(($(now) - t2))
guest_rc=none
if [ $booted = 1 ]; then
	log "ssh answered ${t_boot}s after qemu started; running arm64-guest.sh"
	t3=$(now)
	left=$((TIMEOUT - (t3 - t2)))
	guest_rc=0
	timeout "$left" "${ssh_cmd[@]}" bash -s <"$HERE/arm64-guest.sh" >"$run/guest.log" 2>&1 || guest_rc=$?
	t_guest=$(($(now) - t3))
	echo "----- guest.log (scripts/vm/arm64-guest.sh in the guest)"
	cat "$run/guest.log"
	# Teardown: a clean poweroff, then qemu's exit; killed by pid if it takes too long.
	t4=$(now)
	timeout 30 "${ssh_cmd[@]}" systemctl poweroff --no-block >/dev/null 2>&1 || true
	for _ in $(seq 1 180); do
		kill -0 "$qemu_pid" 2>/dev/null || break
		sleep 1
	done
	if kill -0 "$qemu_pid" 2>/dev/null; then
		log "the guest did not power off within 180s: killing qemu (pid $qemu_pid)"
		kill "$qemu_pid"
	fi
	wait "$qemu_pid" 2>/dev/null || true
	qemu_pid=
	t_down=$(($(now) - t4))
else
	echo "----- console.log (last 60 lines)"
	tail -n 60 "$run/console.log" 2>/dev/null || true
	cat "$run/qemu.log" 2>/dev/null || true
	die "the guest did not answer ssh within ${t_boot}s (qemu $(kill -0 "$qemu_pid" 2>/dev/null && echo running || echo exited))"
fi
phase() { sed -n "s/^arm64-guest: $1 //p" "$run/guest.log" | head -1; }
echo "test-vm-arm64: image ${t_image}s, host build ${t_build}s, boot to ssh ${t_boot}s, in guest ${t_guest}s" \
	"(image import $(phase image-import)s, agent start $(phase agent-start)s, pod Running $(phase pod-running)s)," \
	"poweroff ${t_down}s, total $(($(now) - t0))s"
[ "$guest_rc" = 0 ] || {
	echo "----- console.log (last 40 lines)"
	tail -n 40 "$run/console.log" 2>/dev/null || true
	die "arm64-guest.sh exit code: $guest_rc"
}
echo "test-vm-arm64: PASS"
