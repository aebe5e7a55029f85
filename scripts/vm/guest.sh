#!/usr/bin/env bash
# The v2 lane's tests, run as root inside the guest (by the image's mqlet-lane.service, with the
# checkout at /mqlet/src read-only and the host's prebuilt binaries in /mqlet/out/bin). Its output
# goes to /mqlet/out/guest.log and its exit code to /mqlet/out/rc, which the host's run.sh prints.
# Each step runs even when an earlier one failed, so one run reports everything it can.
set -uo pipefail
SRC=/mqlet/src
BIN=/mqlet/out/bin
NS=mqlet # containerdNamespace of the shipped configs/mqlet.yaml
failed=()

step() { echo; echo "=== $* ($(date -u +%T), $(cut -d' ' -f1 /proc/uptime)s since boot)"; }
fail() {
	echo "FAIL: $*"
	failed+=("$*")
}

step "the guest: systemd as PID 1, cgroup v2 only, system containerd"
uname -a
[ "$(cat /proc/1/comm)" = systemd ] || fail "PID 1 is $(cat /proc/1/comm), not systemd"
fstype=$(stat -fc %T /sys/fs/cgroup)
[ "$fstype" = cgroup2fs ] || fail "/sys/fs/cgroup is $fstype, not cgroup2fs"
if grep -q ' cgroup ' /proc/mounts; then fail "cgroup v1 hierarchies are mounted: $(grep ' cgroup ' /proc/mounts)"; fi
echo "controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
echo "root subtree_control: $(cat /sys/fs/cgroup/cgroup.subtree_control)"
for u in containerd systemd-logind; do
	systemctl is-active --quiet $u || fail "$u is $(systemctl is-active $u), not active"
done
containerd --version
runc --version | head -1

step "agent/cgroup tests on the real v2 hierarchy (MQLET_TEST_REQUIRE_V2=1: a skip of a v2 test fails)"
# From the package's directory: the fixture tests read testdata/ relative to it.
# Only the tests on real cgroups: the fixture tests do not depend on the kernel and run on the
# host with everything else (here they would cost a minute of TCG). The v1 ones skip.
(cd $SRC/agent/cgroup && MQLET_TEST_REQUIRE_V2=1 $BIN/cgroup.test -test.v -test.count=1 -test.timeout=10m -test.run 'Real') >/tmp/cgroup-test.out 2>&1
rc=$?
cat /tmp/cgroup-test.out
[ $rc = 0 ] || fail "agent/cgroup tests exited $rc"
for t in TestManagerRealV2 TestOOMKilledRealV2; do
	grep -q -- "--- PASS: $t " /tmp/cgroup-test.out || fail "$t did not pass"
done

step "a pod from the manifest dir, started by the shipped unit (configs/mqlet.service) on the system containerd"
install -m 755 $BIN/mqlet /usr/local/bin/mqlet
install -m 644 $SRC/configs/mqlet.service /etc/systemd/system/mqlet.service
install -d /etc/mqlet/pods
install -m 644 $SRC/configs/mqlet.yaml /etc/mqlet/mqlet.yaml
install -m 644 $SRC/configs/pods/hello.yaml /etc/mqlet/pods/hello.yaml
ctr -n $NS images import /mqlet/out/images/busybox.tar || fail "ctr -n $NS images import busybox.tar"
ctr -n $NS images ls -q
systemctl daemon-reload
systemctl start mqlet || fail "systemctl start mqlet"
# Wait for both containers of the example pod (web, poller) to run. A bound, not an assertion on
# speed: under TCG the first pod start takes tens of seconds.
pids=()
for _ in $(seq 1 150); do
	mapfile -t pids < <(ctr -n $NS tasks ls 2>/dev/null | awk '$3 == "RUNNING" {print $2}')
	[ ${#pids[@]} -ge 2 ] && break
	systemctl is-active --quiet mqlet || break
	sleep 2
done
mqlet pods -o wide || fail "mqlet pods"
ctr -n $NS tasks ls
if [ ${#pids[@]} -lt 2 ]; then
	fail "the hello pod's two containers are not running (running tasks: ${#pids[@]}; mqlet is $(systemctl is-active mqlet))"
else
	# A manifest pod's name may carry the node's name (as kubelet's static pods do).
	name=$(mqlet pods | awk '$2 ~ /^hello/ && $3 == "2/2" && $4 == "Running" {print $2; exit}')
	[ -n "$name" ] || fail "mqlet pods does not list the hello pod as 2/2 Running"
	# Each container sits in the pod's cgroup below the Burstable tier of the base the shipped
	# config names (cgroupRoot /mqlet, namespace mqlet), sized from the pod's limits: memory
	# 32Mi + 16Mi; no cpu.max because the poller has no cpu limit.
	for pid in "${pids[@]}"; do
		cg=$(sed -n 's/^0:://p' /proc/$pid/cgroup)
		echo "container pid $pid: cgroup $cg"
		pod=$(dirname "$cg")
		case $pod in
		/mqlet/mqlet/burstable/pod*) ;;
		*) fail "container pid $pid is in $cg, not below /mqlet/mqlet/burstable/pod<uid>" ;;
		esac
		for f in memory.max:50331648 cpu.max:"max 100000"; do
			got=$(cat /sys/fs/cgroup$pod/${f%%:*})
			[ "$got" = "${f#*:}" ] || fail "$pod/${f%%:*} = $got, want ${f#*:}"
		done
	done
	# The pod's network and volume work: the poller fetches the web container's page.
	for _ in $(seq 1 30); do
		mqlet logs "${name:-hello}" -c poller 2>/dev/null | grep -q 'poller got: hello from' && break
		sleep 2
	done
	mqlet logs "${name:-hello}" -c poller | tail -3
	mqlet logs "${name:-hello}" -c poller | grep -q 'poller got: hello from' || fail "the poller never got the web container's page"
	# mqlet itself runs in its unit's cgroup, not among the pods.
	main=$(systemctl show -p MainPID --value mqlet)
	own=$(sed -n 's/^0:://p' /proc/$main/cgroup)
	[ "$own" = /system.slice/mqlet.service ] || fail "mqlet (pid $main) runs in $own, not /system.slice/mqlet.service"
	echo "mqlet oom_score_adj: $(cat /proc/$main/oom_score_adj)"
	# The unit's KillMode=process: stopping the agent leaves the pods running.
	systemctl stop mqlet || fail "systemctl stop mqlet"
	for pid in "${pids[@]}"; do
		[ -d /proc/$pid ] || fail "container pid $pid died when the unit stopped (KillMode=process should leave pods running)"
	done
fi

# ---- container usage on v2 (issue 22 point 8): its own section ----
step "mqlet top on the real v2 hierarchy: each container's cpu.stat and memory.current read"
if [ ${#pids[@]} -ge 2 ]; then
	systemctl start mqlet || fail "systemctl start mqlet (for mqlet top)"
	for _ in $(seq 1 60); do
		mqlet pods >/dev/null 2>&1 && break
		sleep 2
	done
	# A container whose cgroup files cannot be read is left out of top, so a row per container
	# of the hello pod is the check that both were read through the v2 files.
	top=$(mqlet top --containers --interval 2s) || fail "mqlet top --containers"
	echo "$top"
	for c in web poller; do
		echo "$top" | awk -v c=$c '$3 == c && $4 ~ /^[0-9]+m$/ && $5 ~ /^[0-9]+Mi$/ {found=1} END {exit !found}' ||
			fail "mqlet top lists no usage for container $c"
	done
	echo "$top" | awk '$1 != "NODE" && $2 ~ /^[0-9]+m$/ {found=1} END {exit !found}' || fail "mqlet top shows no node line"
	systemctl stop mqlet || fail "systemctl stop mqlet (after mqlet top)"
else
	fail "no hello pod to read the usage of"
fi
# ---- end of container usage ----
echo "--- journalctl -u mqlet"
journalctl -u mqlet --no-pager -o short-monotonic | tail -n 60
# The guest is thrown away, but its shutdown would wait 90s for the pod's processes (they belong
# to containerd's shims, which systemd stops last): kill them now.
for t in $(ctr -n $NS tasks ls -q 2>/dev/null); do
	ctr -n $NS tasks kill -s SIGKILL "$t" 2>/dev/null
done

# Eviction and OOM checks: the allocatableMemory.available signal on the real kernel, and the OOM
# watcher's SystemOOM event for a kill outside the pods. Each in its own function.
v2b_eviction_tests() {
	step "agent/eviction on the real v2 hierarchy: allocatableMemory.available evicts before the kernel kills"
	(cd $SRC/agent/eviction && MQLET_TEST_REQUIRE_V2=1 $BIN/eviction.test -test.v -test.count=1 -test.timeout=10m -test.run 'RealV2') >/tmp/eviction-test.out 2>&1
	local rc=$?
	cat /tmp/eviction-test.out
	[ $rc = 0 ] || fail "agent/eviction tests exited $rc"
	grep -q -- "--- PASS: TestAllocatableMemoryEvictionRealV2 " /tmp/eviction-test.out || fail "TestAllocatableMemoryEvictionRealV2 did not pass"
}

v2b_system_oom() {
	step "SystemOOM: the kernel kills a process outside the pods (a systemd scope with MemoryMax) -> a node event"
	local since
	since=$(date '+%Y-%m-%d %H:%M:%S')
	systemctl start mqlet || fail "systemctl start mqlet (SystemOOM check)"
	# The watcher reads from the log's end: wait until it has opened it (bounded, not timed).
	for _ in $(seq 1 60); do
		journalctl -u mqlet --since "$since" --no-pager | grep -q 'oom watcher: reading the kernel log' && break
		sleep 1
	done
	journalctl -u mqlet --since "$since" --no-pager | grep -q 'oom watcher: reading the kernel log' || fail "the OOM watcher did not start"
	# dash keeps the 64 MiB it reads in memory: the kernel kills it at the scope's 16 MiB.
	systemd-run --scope --unit=mqlet-oom-victim -p MemoryMax=16M -p MemorySwapMax=0 \
		sh -c 'x=$(head -c 67108864 /dev/zero | tr "\\0" x); echo "not killed: ${#x}"'
	echo "victim scope exited $?"
	local line=""
	for _ in $(seq 1 60); do
		line=$(journalctl -u mqlet --since "$since" --no-pager | grep 'reason=SystemOOM' | head -1)
		[ -n "$line" ] && break
		sleep 1
	done
	echo "${line:-no SystemOOM line}"
	case $line in
	*"cgroup=/system.slice/mqlet-oom-victim.scope"*) ;;
	*) fail "no SystemOOM for the process killed in mqlet-oom-victim.scope (kernel log: $(dmesg | grep -i 'killed process' | tail -1))" ;;
	esac
	systemctl stop mqlet || fail "systemctl stop mqlet (SystemOOM check)"
	for t in $(ctr -n $NS tasks ls -q 2>/dev/null); do
		ctr -n $NS tasks kill -s SIGKILL "$t" 2>/dev/null
	done
}

v2b_eviction_tests
v2b_system_oom

step "done"
if [ ${#failed[@]} -gt 0 ]; then
	echo "${#failed[@]} check(s) failed:"
	printf '  %s\n' "${failed[@]}"
	exit 1
fi
echo "all checks passed"
