#!/usr/bin/env bash
# Builds (once) the arm64 Debian 12 guest image of `make test-vm-arm64` (scripts/vm/arm64.sh) and
# prints the directory that holds it: rootfs.img (raw ext4), vmlinuz, initrd.img, id_ed25519
# (root's ssh key), busybox (Debian's static arm64 busybox, for the test image).
#
# The recipe is the amd64 lane's (image.sh, customize.sh) for --architectures=arm64:
# linux-image-arm64, systemd as PID 1, Debian's containerd and runc as system services, plus
# busybox-static. mmdebstrap runs arm64 maintainer scripts through qemu-user, which needs a binfmt_misc
# handler for aarch64 ELF files. The host's binfmt_misc is never touched: the build runs in a user
# namespace of its own (every id mapped to itself, so ownership in the image is real) with a mount
# namespace in which a private binfmt_misc instance (Linux >= 6.7 gives each user namespace its own)
# has the one handler, Debian's qemu-aarch64-static with the F flag. `--exec CMD...` runs any
# command that way (arm64.sh uses it for scripts/mkimage, which runs busybox --list).
#
# Cached under $MQLET_VM_DIR (default /var/lib/mqlet-test/vm) as arm64-debian12-<hash of the
# recipe> (not debian12-*: image.sh removes those of other recipes), with a lock of its own
# (lock-arm64) so an arm64 build never holds up the amd64 lane. Built in a temporary directory
# and renamed into place only when complete.
#
# Usage: scripts/vm/arm64-image.sh            build if missing; print the image directory
#        scripts/vm/arm64-image.sh --path     print the directory it would use, build nothing
#        scripts/vm/arm64-image.sh --exec CMD  run CMD with aarch64 binaries runnable (see above)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VM_DIR=${MQLET_VM_DIR:-/var/lib/mqlet-test/vm}
MIRROR=${MQLET_VM_MIRROR:-http://deb.debian.org/debian}
SECURITY=${MQLET_VM_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
SIZE=3G

log() { echo "vm-arm64-image: $*" >&2; }
die() {
	echo "vm-arm64-image: ERROR: $*" >&2
	exit 1
}

# with_arm64_binfmt CMD...: runs CMD in a new user + mount namespace, every uid and gid mapped to
# itself, where a private binfmt_misc instance runs aarch64 ELF files with qemu-aarch64-static.
# The map is written from here (root in the parent namespace may map the whole range; no
# newuidmap, no /etc/subuid entry); a fifo holds the child until it is.
with_arm64_binfmt() {
	local d pid rc=0 rule
	[ -x /usr/bin/qemu-aarch64-static ] || die "qemu-aarch64-static not found: apt-get install --no-install-recommends qemu-user-static"
	# Debian's own rule (magic and mask of an aarch64 ELF), with the static emulator as interpreter;
	# F: the kernel opens it now, so it also runs inside chroots that do not have it.
	rule=$(sed -n 's|^\(:qemu-aarch64:M::[^:]*:[^:]*:\)[^:]*:.*|\1/usr/bin/qemu-aarch64-static:F|p' /usr/lib/binfmt.d/qemu-aarch64.conf 2>/dev/null)
	[ -n "$rule" ] || die "no aarch64 rule in /usr/lib/binfmt.d/qemu-aarch64.conf (qemu-user-static)"
	d=$(mktemp -d /tmp/mqlet-binfmt.XXXXXX)
	mkfifo "$d/go"
	printf '%s\n' "$rule" >"$d/rule"
	unshare --user --mount --propagation private -- bash -c '
		read -r go <"$1"
		[ "$go" = go ] || exit 97
		mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc || { echo "cannot mount a private binfmt_misc (Linux >= 6.7 needed)" >&2; exit 97; }
		cat "$2" >/proc/sys/fs/binfmt_misc/register || exit 97
		shift 2
		exec "$@"' _ "$d/go" "$d/rule" "$@" &
	pid=$!
	local self
	self=$(readlink /proc/self/ns/user)
	for _ in $(seq 1 200); do
		[ "$(readlink /proc/$pid/ns/user 2>/dev/null)" != "$self" ] && break
		sleep 0.05
	done
	if echo "0 0 4294967295" >/proc/$pid/uid_map && echo "0 0 4294967295" >/proc/$pid/gid_map; then
		echo go >"$d/go"
	else
		echo no >"$d/go"
	fi
	wait $pid || rc=$?
	rm -rf "$d"
	return $rc
}

if [ "${1:-}" = --exec ]; then
	shift
	with_arm64_binfmt "$@"
	exit $?
fi

# Bump RECIPE for a change of the image that the rest of the key does not see (e.g. SIZE).
RECIPE=1
packages=(
	systemd-sysv udev kmod dbus # systemd as PID 1, logind over dbus
	linux-image-arm64           # with 9p and 9pnet_virtio as modules
	containerd runc containernetworking-plugins iptables
	openssh-server procps iproute2 ca-certificates
	busybox-static # its /bin/busybox makes the arm64 test image (scripts/mkimage)
)
essential_hook='mkdir -p "$1/etc/initramfs-tools/conf.d" && echo MODULES=list >"$1/etc/initramfs-tools/conf.d/mqlet-lane.conf"'
key=$( (echo "arm64 $RECIPE $SIZE ${packages[*]} $essential_hook" && cat "$HERE/customize.sh") | sha256sum | cut -c1-16)
IMAGE=$VM_DIR/arm64-debian12-$key
if [ "${1:-}" = --path ]; then
	echo "$IMAGE"
	exit 0
fi

[ "$(id -u)" = 0 ] || die "must run as root (mmdebstrap in root mode, mkfs of a root file system)"
for c in mmdebstrap mkfs.ext4 ssh-keygen arch-test unshare; do
	command -v $c >/dev/null || die "$c not found: apt-get install mmdebstrap e2fsprogs openssh-client arch-test util-linux"
done

mkdir -p "$VM_DIR"
exec 9>"$VM_DIR/lock-arm64"
flock -s 9
if [ -e "$IMAGE/complete" ]; then
	echo "$IMAGE"
	exit 0
fi
flock -x 9
if [ -e "$IMAGE/complete" ]; then
	echo "$IMAGE"
	exit 0
fi

start=$(date +%s)
tmp=$(mktemp -d "$VM_DIR/build-arm64.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
log "building $IMAGE (mmdebstrap --architectures=arm64 with qemu-user: many minutes)"
ssh-keygen -q -t ed25519 -N '' -C mqlet-vm-lane-arm64 -f "$tmp/id_ed25519"

with_arm64_binfmt timeout 3600 mmdebstrap --variant=minbase --mode=root --format=directory --architectures=arm64 \
	--include="$(echo "${packages[@]}" | tr ' ' ,)" \
	--essential-hook="$essential_hook" \
	--customize-hook="bash '$HERE/customize.sh' \"\$1\" '$tmp/id_ed25519.pub'" \
	bookworm "$tmp/root" \
	"deb $MIRROR bookworm main" \
	"deb $MIRROR bookworm-updates main" \
	"deb $SECURITY bookworm-security main" >"$tmp/mmdebstrap.log" 2>&1 ||
	{
		tail -n 30 "$tmp/mmdebstrap.log" >&2
		die "mmdebstrap failed (log above)"
	}
log "mmdebstrap done after $(($(date +%s) - start))s"

kver=$(ls "$tmp/root/lib/modules")
[ "$(echo "$kver" | wc -w)" = 1 ] || die "expected one kernel in the image, found: $kver"
for m in fs/9p/9p.ko net/9p/9pnet_virtio.ko; do
	[ -e "$tmp/root/lib/modules/$kver/kernel/$m" ] || die "kernel $kver has no $m: the lane's 9p shares cannot mount"
done
cp "$tmp/root/boot/vmlinuz-$kver" "$tmp/vmlinuz"
cp "$tmp/root/boot/initrd.img-$kver" "$tmp/initrd.img"
cp "$tmp/root/bin/busybox" "$tmp/busybox"
mkfs.ext4 -q -F -L mqlet-root -d "$tmp/root" "$tmp/rootfs.img" $SIZE >&2
rm -rf "$tmp/root"
echo "$kver" >"$tmp/kernel-version"
date -u +%FT%TZ >"$tmp/complete"
mv "$tmp" "$IMAGE"
trap - EXIT
log "built $IMAGE in $(($(date +%s) - start))s (kernel $kver)"

for old in "$VM_DIR"/arm64-debian12-*; do
	[ "$old" = "$IMAGE" ] || rm -rf "$old"
done
echo "$IMAGE"
