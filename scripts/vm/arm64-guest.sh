#!/usr/bin/env bash
# Run as root in the arm64 guest of `make test-vm-arm64` (scripts/vm/arm64.sh feeds it over ssh):
# checks the guest is what the lane claims (aarch64, systemd as PID 1, cgroup v2 only, Debian's
# containerd active), then starts one pod the way a user would: the host-built arm64 mqlet under
# the shipped unit (configs/mqlet.service) with the shipped configs/mqlet.yaml, the arm64 busybox
# test image imported into containerd, configs/pods/hello.yaml dropped into the manifest dir, and
# waits for `mqlet pods` to list it 2/2 Running. The run directory (binaries, image, the checkout's
# configs) is the 9p share "out", mounted read-only at /mqlet/out.
# Prints "arm64-guest: <phase> <seconds>" lines that arm64.sh reports; exits non-zero on a failure.
set -uo pipefail
OUT=/mqlet/out
NS=mqlet # containerdNamespace of the shipped configs/mqlet.yaml
failed=()
fail() {
	echo "FAIL: $*"
	failed+=("$*")
}
step() { echo; echo "=== $* ($(date -u +%T), $(cut -d' ' -f1 /proc/uptime)s since boot)"; }

step "the guest"
uname -a
[ "$(uname -m)" = aarch64 ] || fail "the guest is $(uname -m), not aarch64"
[ "$(cat /proc/1/comm)" = systemd ] || fail "PID 1 is $(cat /proc/1/comm), not systemd"
fstype=$(stat -fc %T /sys/fs/cgroup)
[ "$fstype" = cgroup2fs ] || fail "/sys/fs/cgroup is $fstype, not cgroup2fs"
if grep -q ' cgroup ' /proc/mounts; then fail "cgroup v1 hierarchies are mounted"; fi
echo "controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
for u in containerd systemd-logind; do
	systemctl is-active --quiet $u || fail "$u is $(systemctl is-active $u), not active"
done
containerd --version
runc --version | head -1
mkdir -p $OUT
mountpoint -q $OUT || mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288,ro out $OUT || fail "mount the out share"

step "one pod: the arm64 mqlet under the shipped unit, hello.yaml in the manifest dir"
t0=$(date +%s.%N)
install -m 755 $OUT/bin/mqlet /usr/local/bin/mqlet
file_out=$(head -c 20 /usr/local/bin/mqlet | od -An -tx1 | tr -d ' \n')
case $file_out in 7f454c46*b700) ;; *) fail "/usr/local/bin/mqlet is not an aarch64 ELF ($file_out)" ;; esac
mqlet version || fail "mqlet version"
install -m 644 $OUT/configs/mqlet.service /etc/systemd/system/mqlet.service
install -d /etc/mqlet/pods
install -m 644 $OUT/configs/mqlet.yaml /etc/mqlet/mqlet.yaml
ctr -n $NS images import $OUT/images/busybox.tar || fail "ctr -n $NS images import busybox.tar"
ctr -n $NS images ls
t_import=$(date +%s.%N)
systemctl daemon-reload
systemctl start mqlet || fail "systemctl start mqlet"
t_agent=$(date +%s.%N)
install -m 644 $OUT/configs/pods/hello.yaml /etc/mqlet/pods/hello.yaml
# A bound, not a speed assertion: the first pod start under TCG takes tens of seconds.
name=
for _ in $(seq 1 300); do
	name=$(mqlet pods 2>/dev/null | awk '$2 ~ /^hello/ && $3 == "2/2" && $4 == "Running" {print $2; exit}')
	[ -n "$name" ] && break
	systemctl is-active --quiet mqlet || break
	sleep 1
done
t_pod=$(date +%s.%N)
mqlet pods -o wide || fail "mqlet pods"
ctr -n $NS tasks ls
if [ -z "$name" ]; then
	fail "mqlet pods does not list the hello pod as 2/2 Running (mqlet is $(systemctl is-active mqlet))"
	journalctl -u mqlet --no-pager | tail -n 40
else
	for _ in $(seq 1 60); do
		mqlet logs "$name" -c poller 2>/dev/null | grep -q 'poller got: hello from' && break
		sleep 1
	done
	mqlet logs "$name" -c poller | tail -2
	mqlet logs "$name" -c poller | grep -q 'poller got: hello from' || fail "the poller never got the web container's page"
	for pid in $(ctr -n $NS tasks ls | awk '$3 == "RUNNING" {print $2}'); do
		echo "container pid $pid ($(tr '\0' ' ' </proc/$pid/cmdline)): cgroup $(sed -n 's/^0:://p' /proc/$pid/cgroup)"
	done
fi
t_logs=$(date +%s.%N)
secs() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.1f", b - a}'; }
echo "arm64-guest: image-import $(secs "$t0" "$t_import")"
echo "arm64-guest: agent-start $(secs "$t_import" "$t_agent")"
echo "arm64-guest: pod-running $(secs "$t_agent" "$t_pod")"
echo "arm64-guest: pod-talks $(secs "$t_pod" "$t_logs")"

# The guest is thrown away (snapshot=on); kill the pod's processes so its shutdown does not wait
# for them.
systemctl stop mqlet
for t in $(ctr -n $NS tasks ls -q 2>/dev/null); do
	ctr -n $NS tasks kill -s SIGKILL "$t" 2>/dev/null
done
if [ ${#failed[@]} -gt 0 ]; then
	printf 'FAIL: %s\n' "${failed[@]}"
	exit 1
fi
echo "arm64-guest: PASS"
