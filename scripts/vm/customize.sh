#!/usr/bin/env bash
# mmdebstrap's customize hook for the lane's guest (scripts/vm/image.sh): $1 is the root file
# system, $2 root's ssh public key. Everything here is baked into the cached image; what the lane
# tests lives in guest.sh, read from the checkout at every boot.
set -euo pipefail
root=$1
pubkey=$2

echo mqlet-vm >"$root/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 mqlet-vm\n' >"$root/etc/hosts"
printf '/dev/vda / ext4 defaults,noatime 0 1\n' >"$root/etc/fstab"
# A root shell on the serial console for debugging a booted guest by hand; the guest has no
# network but the host's forwarded ssh port on 127.0.0.1.
chroot "$root" passwd --delete root >/dev/null
install -d -m 700 "$root/root/.ssh"
install -m 600 "$pubkey" "$root/root/.ssh/authorized_keys"

# The virtio NIC of qemu's user-mode network, by DHCP (for the forwarded ssh port).
cat >"$root/etc/systemd/network/10-virtio.network" <<'NET'
[Match]
Name=en*
[Network]
DHCP=ipv4
NET
chroot "$root" systemctl enable systemd-networkd.service >/dev/null 2>&1

# 9p is a module in Debian's kernel; load it early so the lane's mounts never race it.
printf '9p\n9pnet_virtio\n' >"$root/etc/modules-load.d/mqlet-lane.conf"

# A small initramfs: the root is a virtio disk with ext4, nothing else is needed to mount it, and
# unpacking Debian's default (MODULES=most) one costs seconds under TCG.
echo MODULES=list >"$root/etc/initramfs-tools/conf.d/mqlet-lane.conf"
printf 'virtio_pci\nvirtio_blk\next4\n' >>"$root/etc/initramfs-tools/modules"
chroot "$root" update-initramfs -u -k all >/dev/null 2>&1

# The lane itself: at boot, mount the host's shares and run the checkout's scripts/vm/guest.sh,
# then power off. The kernel argument mqlet.lane=0 boots without it (a guest to look around in).
cat >"$root/usr/local/sbin/mqlet-lane" <<'LANE'
#!/bin/bash
# Mounts the lane's 9p shares (src: the checkout, read-only; out: binaries in, results out), runs
# guest.sh, leaves its exit code in out/rc for the host, and powers the guest off.
set -u
say() { echo "mqlet-lane: $*" >/dev/console; }
mkdir -p /mqlet/src /mqlet/out
if ! mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288 out /mqlet/out; then
	say "cannot mount the out share; no results can reach the host"
	systemctl poweroff --no-block
	exit 1
fi
if ! mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288,ro src /mqlet/src; then
	say "cannot mount the src share"
	echo 'mount src share failed' >/mqlet/out/guest.log
	echo 98 >/mqlet/out/rc
else
	say "running scripts/vm/guest.sh"
	bash /mqlet/src/scripts/vm/guest.sh >/mqlet/out/guest.log 2>&1
	rc=$?
	say "guest.sh exited $rc"
	echo $rc >/mqlet/out/rc.tmp && mv /mqlet/out/rc.tmp /mqlet/out/rc
fi
sync
systemctl poweroff --no-block
LANE
chmod 755 "$root/usr/local/sbin/mqlet-lane"
cat >"$root/etc/systemd/system/mqlet-lane.service" <<'UNIT'
[Unit]
Description=mqlet v2 lane: run the checkout's scripts/vm/guest.sh and power off
After=containerd.service systemd-logind.service systemd-modules-load.service
ConditionKernelCommandLine=!mqlet.lane=0

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/mqlet-lane
StandardOutput=journal+console

[Install]
WantedBy=multi-user.target
UNIT
chroot "$root" systemctl enable mqlet-lane.service containerd.service ssh.service >/dev/null 2>&1
# Nothing in the guest image may wait on a network it does not have, nor start maintenance in the
# middle of a run. These are units of the guest image being built under $root (never the host's):
# linking them to /dev/null in the image is what masking them there means.
for unit in systemd-networkd-wait-online.service apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer; do
	ln -sf /dev/null "$root/etc/systemd/system/$unit"
done
