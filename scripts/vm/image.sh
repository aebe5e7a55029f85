#!/usr/bin/env bash
# Builds (once) the Debian 12 guest image of mqlet's cgroup v2 lane and prints the directory that
# holds it: rootfs.img (raw ext4), vmlinuz, initrd.img, id_ed25519 (root's ssh key).
#
# Debian's packages only: mmdebstrap makes the root file system from deb.debian.org (bookworm,
# bookworm-updates, bookworm-security), with systemd as PID 1, linux-image-amd64 (the cloud
# kernel has no 9p modules, which the lane's shares need), and Debian's containerd and runc
# enabled as system services. The guest setup is in customize.sh; the tests it runs come from
# the checkout at every boot (guest.sh), so changing them needs no new image.
#
# The image lives under $MQLET_VM_DIR (default /var/lib/mqlet-test/vm) in a directory named
# after a hash of the recipe (RECIPE, the package list, the hooks, customize.sh): a changed recipe
# builds a new image, an unchanged one is reused; editing the rest of this script does not rebuild. Builds are serialized by a lock file, so concurrent callers build
# once and the others wait and reuse it; a build is made in a temporary directory and renamed
# into place only when complete, so an interrupted build leaves nothing that looks finished.
#
# Usage: scripts/vm/image.sh            build if missing; print the image directory
#        scripts/vm/image.sh --path     print the directory it would use, build nothing
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VM_DIR=${MQLET_VM_DIR:-/var/lib/mqlet-test/vm}
MIRROR=${MQLET_VM_MIRROR:-http://deb.debian.org/debian}
SECURITY=${MQLET_VM_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
SIZE=3G

log() { echo "vm-image: $*" >&2; }
die() {
	echo "vm-image: ERROR: $*" >&2
	exit 1
}

# Bump RECIPE for a change of the image that the rest of the key does not see (e.g. SIZE).
RECIPE=2
packages=(
	systemd-sysv udev kmod dbus # systemd as PID 1, logind over dbus
	linux-image-amd64           # with 9p and 9pnet_virtio as modules
	containerd runc containernetworking-plugins iptables
	openssh-server procps iproute2 ca-certificates
)
# Before the kernel is installed: its initramfs gets only the modules listed (customize.sh adds
# virtio and ext4 and makes it again), not Debian's MODULES=most, which took 12 of this build's
# 23 minutes here under load and costs seconds of unpacking at every boot under TCG.
essential_hook='mkdir -p "$1/etc/initramfs-tools/conf.d" && echo MODULES=list >"$1/etc/initramfs-tools/conf.d/mqlet-lane.conf"'
key=$( (echo "$RECIPE $SIZE ${packages[*]} $essential_hook" && cat "$HERE/customize.sh") | sha256sum | cut -c1-16)
IMAGE=$VM_DIR/debian12-$key
if [ "${1:-}" = --path ]; then
	echo "$IMAGE"
	exit 0
fi

[ "$(id -u)" = 0 ] || die "must run as root (mmdebstrap in root mode, mkfs of a root file system)"
for c in mmdebstrap mkfs.ext4 ssh-keygen; do
	command -v $c >/dev/null || die "$c not found: apt-get install mmdebstrap e2fsprogs openssh-client"
done

mkdir -p "$VM_DIR"
exec 9>"$VM_DIR/lock"
# A cached image is found under the shared lock, which running lanes hold too: waiting for the
# exclusive one first made every lane wait for all guests already running (minutes each).
flock -s 9
if [ -e "$IMAGE/complete" ]; then
	echo "$IMAGE"
	exit 0
fi
flock -x 9
if [ -e "$IMAGE/complete" ]; then # built by another caller while this one waited
	echo "$IMAGE"
	exit 0
fi

start=$(date +%s)
tmp=$(mktemp -d "$VM_DIR/build.XXXXXX")
# A failed or interrupted build removes its own partial output (never another build's).
trap 'rm -rf "$tmp"' EXIT
log "building $IMAGE (mmdebstrap, a few minutes)"
ssh-keygen -q -t ed25519 -N '' -C mqlet-vm-lane -f "$tmp/id_ed25519"

# Bounded: a mirror that stalls must not hold the lock (and every other caller) forever.
timeout 3600 mmdebstrap --variant=minbase --mode=root --format=directory \
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

kver=$(ls "$tmp/root/lib/modules")
[ "$(echo "$kver" | wc -w)" = 1 ] || die "expected one kernel in the image, found: $kver"
for m in fs/9p/9p.ko net/9p/9pnet_virtio.ko; do
	[ -e "$tmp/root/lib/modules/$kver/kernel/$m" ] || die "kernel $kver has no $m: the lane's 9p shares cannot mount"
done
cp "$tmp/root/boot/vmlinuz-$kver" "$tmp/vmlinuz"
cp "$tmp/root/boot/initrd.img-$kver" "$tmp/initrd.img"
# A sparse raw image filled from the directory: no loop device, no mount on the host.
# stdout is the image path for the caller: mke2fs says "Creating regular file" there even with -q.
mkfs.ext4 -q -F -L mqlet-root -d "$tmp/root" "$tmp/rootfs.img" $SIZE >&2
rm -rf "$tmp/root"
echo "$kver" >"$tmp/kernel-version"
date -u +%FT%TZ >"$tmp/complete"
mv "$tmp" "$IMAGE"
trap - EXIT
log "built $IMAGE in $(($(date +%s) - start))s (kernel $kver)"

# Older recipes' images are of no further use; a lane still running one keeps its open file.
for old in "$VM_DIR"/debian12-*; do
	[ "$old" = "$IMAGE" ] || rm -rf "$old"
done
echo "$IMAGE"
