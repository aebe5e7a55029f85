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
for t in TestManagerRealV2 TestOOMKilledRealV2 TestNodeAllocatableConvergesRealV2 TestPodMemoryLimitDropRealV2 TestPodPidsLimitRealV2; do
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
	# The shipped config's cgroupDriver auto on this host (systemd, cgroup v2): the pods' tree is
	# below a transient scope systemd delegated to mqlet, kept alive by a holder in a leaf of it.
	systemctl show -p ControlGroup,ActiveState,Delegate,Slice,TasksMax mqlet-pods.scope
	scope=$(systemctl show -p ControlGroup --value mqlet-pods.scope)
	[ "$scope" = /mqlet.slice/mqlet-pods.scope ] || fail "mqlet-pods.scope's cgroup is '$scope', not /mqlet.slice/mqlet-pods.scope"
	[ "$(systemctl show -p Delegate --value mqlet-pods.scope)" = yes ] || fail "mqlet-pods.scope is not delegated (Delegate=$(systemctl show -p Delegate --value mqlet-pods.scope))"
	[ "$(systemctl show -p TasksMax --value mqlet-pods.scope)" = infinity ] || fail "mqlet-pods.scope has TasksMax=$(systemctl show -p TasksMax --value mqlet-pods.scope), not infinity"
	holder=$(cat /sys/fs/cgroup$scope/holder/cgroup.procs 2>/dev/null)
	[ -n "$holder" ] && [ "$(tr '\0' ' ' </proc/$holder/cmdline 2>/dev/null)" = "/usr/bin/sleep infinity " ] || fail "no holder (sleep infinity) in $scope/holder (cgroup.procs: '$holder')"
	echo "holder pid $holder: $(grep -E '^(VmRSS|RssAnon)' /proc/$holder/status 2>/dev/null | tr -s ' \t\n' ' ')"
	echo "scope subtree_control: $(cat /sys/fs/cgroup$scope/cgroup.subtree_control)"
	systemd-cgls --no-pager -u mqlet.slice 2>/dev/null | head -20
	# Each container sits in the pod's cgroup below the Burstable tier of the base the shipped
	# config names (cgroupRoot /mqlet, namespace mqlet) in that scope, sized from the pod's limits:
	# memory 32Mi + 16Mi; no cpu.max because the poller has no cpu limit.
	for pid in "${pids[@]}"; do
		cg=$(sed -n 's/^0:://p' /proc/$pid/cgroup)
		echo "container pid $pid: cgroup $cg"
		pod=$(dirname "$cg")
		case $pod in
		$scope/mqlet/mqlet/burstable/pod*) ;;
		*) fail "container pid $pid is in $cg, not below $scope/mqlet/mqlet/burstable/pod<uid>" ;;
		esac
		for f in memory.max:50331648 cpu.max:"max 100000"; do
			got=$(cat /sys/fs/cgroup$pod/${f%%:*})
			[ "$got" = "${f#*:}" ] || fail "$pod/${f%%:*} = $got, want ${f#*:}"
		done
	done
	# Inside, each container sees its own cgroup as the root of a read-only cgroup2 mount in a
	# cgroup namespace of its own (issue 24 point 4, as containerd's CRI): memory.max there is the
	# container's limit. ctr exec, not mqlet exec: this checks the spec, not mqlet's exec path.
	while read -r id pid; do
		want=$(cat /sys/fs/cgroup$(sed -n 's/^0:://p' /proc/$pid/cgroup)/memory.max)
		got=$(ctr -n $NS tasks exec --exec-id cgview-$pid $id </dev/null sh -c 'echo $(cat /sys/fs/cgroup/memory.max) $(sed -n "s/^0:://p" /proc/self/cgroup) $( (echo max >/sys/fs/cgroup/memory.max) 2>/dev/null && echo writable || echo read-only)')
		echo "container $id sees: $got (its limit on the host: $want)"
		[ "$got" = "$want / read-only" ] || fail "container $id sees \"$got\" in /sys/fs/cgroup, want \"$want / read-only\""
	done < <(ctr -n $NS tasks ls 2>/dev/null | awk '$3 == "RUNNING" {print $1, $2}')
	# The pod's network and volume work: the poller fetches the web container's page.
	for _ in $(seq 1 30); do
		mqlet logs "${name:-hello}" -c poller 2>/dev/null | grep 'poller got: hello from' >/dev/null && break
		sleep 2
	done
	mqlet logs "${name:-hello}" -c poller | tail -3
	mqlet logs "${name:-hello}" -c poller | grep 'poller got: hello from' >/dev/null || fail "the poller never got the web container's page"
	# mqlet itself runs in its unit's cgroup, not among the pods.
	main=$(systemctl show -p MainPID --value mqlet)
	own=$(sed -n 's/^0:://p' /proc/$main/cgroup)
	[ "$own" = /system.slice/mqlet.service ] || fail "mqlet (pid $main) runs in $own, not /system.slice/mqlet.service"
	echo "mqlet oom_score_adj: $(cat /proc/$main/oom_score_adj)"
	# The unit's KillMode=process: stopping the agent leaves the pods running, in the scope.
	systemctl stop mqlet || fail "systemctl stop mqlet"
	for pid in "${pids[@]}"; do
		[ -d /proc/$pid ] || fail "container pid $pid died when the unit stopped (KillMode=process should leave pods running)"
	done
	systemctl is-active --quiet mqlet-pods.scope || fail "mqlet-pods.scope is $(systemctl is-active mqlet-pods.scope) after mqlet stopped, not active"
	# The holder killed (kill -9) while pods run, then systemd re-executed: the pods keep the
	# scope; the next start of the agent (the top step below) puts a new holder in its leaf.
	kill -9 "$holder" 2>/dev/null
	systemctl daemon-reexec
	systemctl is-active --quiet mqlet-pods.scope || fail "mqlet-pods.scope is $(systemctl is-active mqlet-pods.scope) after its holder was killed with pods running and a daemon-reexec"
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
	h=$(cat /sys/fs/cgroup$scope/holder/cgroup.procs 2>/dev/null | tr '\n' ' ')
	[ "$(echo $h | wc -w)" = 1 ] || fail "the agent's start after its holder was killed left '$h' in $scope/holder, not one new holder"
else
	fail "no hello pod to read the usage of"
fi
# ---- end of container usage ----

# ---- start back-off under systemd 252 (issue 22 point 6): its own section ----
step "a config the agent refuses: the shipped unit restarts it with a growing wait (0 s, then 5 s), which a stop ends"
cp /etc/mqlet/mqlet.yaml /tmp/mqlet.yaml.good
echo "startBackoffLaneBogusKey: 1" >>/etc/mqlet/mqlet.yaml
rm -f /run/mqlet/start-failures
bo_since=$(date '+%Y-%m-%d %H:%M:%S')
bo_log() { journalctl -u mqlet --since "$bo_since" --no-pager; }
bo_wait() { # until the journal has $1: a bound, not a speed check
	for _ in $(seq 1 60); do
		bo_log | grep -q -- "$1" && return 0
		sleep 1
	done
	return 1
}
# --no-block: the start job ends with the first failed attempt; systemd's restarts follow, the
# 2nd RestartSec (5 s) after the 1st, in a new process that reads the count the 1st left.
systemctl --no-block start mqlet
bo_wait 'attempt=2 wait=5s' || fail "no 2nd failed start with attempt=2 wait=5s in the journal"
bo_log | grep 'failed to start'
bo_log | grep 'failed to start' | sed -n 1p | grep -q 'attempt=1 wait=0s .*startBackoffLaneBogusKey' || fail "the 1st failed start is not logged with attempt=1 wait=0s and the bad key"
bo_log | grep 'failed to start' | sed -n 2p | grep -q 'attempt=2 wait=5s .*startBackoffLaneBogusKey' || fail "the 2nd failed start (a new process started by systemd) is not logged with attempt=2 wait=5s"
# This stop may come during the 5 s wait or after it: what a stop does is checked below, on a
# wait far longer than this guest's slowness.
systemctl stop mqlet
# Six failures counted already: the 7th waits 160 s, and a stop must end that wait at once.
bo_since=$(date '+%Y-%m-%d %H:%M:%S')
echo 6 >/run/mqlet/start-failures
systemctl --no-block start mqlet
bo_wait 'attempt=7 wait=2m40s' || fail "no failed start with attempt=7 wait=2m40s after six counted"
status=$(systemctl show -p StatusText --value mqlet)
echo "state $(systemctl is-active mqlet), StatusText: $status, counter: $(cat /run/mqlet/start-failures 2>&1)"
case $status in "start failed (attempt 7, next after 2m40s"*) ;; *) fail "StatusText during the wait is '$status', not the failed start's" ;; esac
[ "$(cat /run/mqlet/start-failures 2>/dev/null)" = 7 ] || fail "/run/mqlet/start-failures is not 7 during the 7th wait"
# timeout: a bound on a hang, far below the 160 s the wait would otherwise last.
timeout 60 systemctl stop mqlet || fail "systemctl stop mqlet did not end the 160 s back-off wait"
bo_log | grep -q 'stopped while waiting after a failed start.*attempt=7' || fail "no log line that the stop ended the wait"
[ -e /run/mqlet/start-failures ] && fail "/run/mqlet/start-failures ($(cat /run/mqlet/start-failures)) is left after a stop"
cp /tmp/mqlet.yaml.good /etc/mqlet/mqlet.yaml
systemctl reset-failed mqlet 2>/dev/null
# ---- end of start back-off ----
echo "--- journalctl -u mqlet"
journalctl -u mqlet --no-pager -o short-monotonic | tail -n 60
# The guest is thrown away, but its shutdown would wait 90s for the pod's processes (they belong
# to containerd's shims, which systemd stops last): kill them now.
for t in $(ctr -n $NS tasks ls -q 2>/dev/null); do
	ctr -n $NS tasks kill -s SIGKILL "$t" 2>/dev/null
done

# ---- Resource policy on v2 under systemd (issue 21, branch v2a): memory limits never lowered
# under running pods (node allocatable, a pod's dropped limit), memory.oom.group, no swap for
# BestEffort containers, podPidsLimit, and pods' cgroups left alone by systemd. Kept in functions
# of their own (v2a_*), run after the hello pod's step with mqlet started again by its unit.
v2a_pod_name() { mqlet pods 2>/dev/null | awk -v p="$1" '$2 ~ "^"p {print $2; exit}'; }
# v2a_task_pid CONTAINER: the pid of the running task whose container id names CONTAINER.
v2a_task_pid() { ctr -n $NS tasks ls 2>/dev/null | awk -v c="-$1-" '$3 == "RUNNING" && index($1, c) {print $2; exit}'; }
v2a_cgroup_of() { sed -n 's/^0:://p' /proc/$1/cgroup; }
# v2a_wait WHAT CMD...: until CMD succeeds; a bound (TCG is slow), not a timing assertion.
v2a_wait() {
	local what=$1
	shift
	for _ in $(seq 1 120); do
		"$@" && return 0
		sleep 2
	done
	fail "$what"
	return 1
}
v2a_manifest() { # NAME MEMORY-LIMIT COMMAND: a pod of one container NAME with no memory request
	# Written aside and renamed in: the agent must not read it half-written.
	cat >/etc/mqlet/$1.yaml.new <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: $1
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "$3"]
    resources: {requests: {memory: "0"}, limits: {memory: $2}}
YAML
	mv /etc/mqlet/$1.yaml.new /etc/mqlet/pods/$1.yaml
}
v2a_running() { [ -n "$(v2a_task_pid "$1")" ]; }

v2a_resource_policy() {
	step "v2a: resource policy on v2 under the unit: node allocatable, limit drops, oom.group, swap, podPidsLimit, systemd"
	local hold="dd if=/dev/zero bs=64M count=1 2>/dev/null | sleep 1000000"
	rm -f /etc/mqlet/pods/*.yaml
	sed -i 's/^podPidsLimit: .*/podPidsLimit: 16/' /etc/mqlet/mqlet.yaml
	v2a_manifest hog 128Mi "$hold"
	v2a_manifest drop 128Mi "$hold"
	# Two processes; the second allocates past the limit.
	v2a_manifest oomer 32Mi "sleep 1000000 & dd if=/dev/zero of=/dev/null bs=64M count=1; wait"
	# The loop runs in a shell of its own: ash gives up at the first fork refused, and the
	# container's main process must stay.
	v2a_manifest forker 32Mi "sh -c 'for i in \$(seq 1 40); do sleep 1000000 & done'; exec sleep 1000000"
	cat >/etc/mqlet/pods/idle.yaml <<YAML
apiVersion: v1
kind: Pod
metadata: {name: idle}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - {name: idle, image: mqlet.test/busybox:1, command: ["sleep", "1000000"]}
YAML
	systemctl start mqlet || fail "systemctl start mqlet"
	for c in hog drop idle forker; do
		v2a_wait "v2a: the $c container never ran" v2a_running $c
	done
	local base=/sys/fs/cgroup$(systemctl show -p ControlGroup --value mqlet-pods.scope)/mqlet/mqlet pid cg
	[ -d "$base" ] || fail "v2a: no pods' base $base below mqlet-pods.scope"

	# No swap for a BestEffort container (kubelet's NoSwap), and memory.oom.group=1.
	pid=$(v2a_task_pid idle)
	if [ -n "$pid" ]; then
		cg=/sys/fs/cgroup$(v2a_cgroup_of $pid)
		echo "idle (BestEffort) container: $cg"
		[ "$(cat $cg/memory.swap.max)" = 0 ] || fail "BestEffort container $cg: memory.swap.max = $(cat $cg/memory.swap.max), want 0"
		[ "$(cat $cg/memory.oom.group)" = 1 ] || fail "container $cg: memory.oom.group = $(cat $cg/memory.oom.group), want 1"
	fi

	# memory.oom.group: the dd past the limit takes the container's sleep and shell with it, so the
	# container ends OOMKilled and is restarted (restartPolicy Always) instead of running on.
	oomed() {
		local n
		n=$(v2a_pod_name oomer)
		[ -n "$n" ] && mqlet describe pod "$n" 2>/dev/null | grep 'Reason: *OOMKilled' >/dev/null &&
			mqlet describe pod "$n" 2>/dev/null | grep -Eq 'Restart Count: *[1-9]'
	}
	v2a_wait "v2a: the oomer container (two processes, one past its limit) was not reported OOMKilled and restarted" oomed
	mqlet describe pod "$(v2a_pod_name oomer)" | grep -E 'State|Reason|Exit Code|Restart Count' | head -8
	# Its next OOM kills would show in the base's counters the restart below checks.
	systemctl is-active --quiet mqlet-pods.scope || fail "mqlet-pods.scope is $(systemctl is-active mqlet-pods.scope) after an OOM kill in a pod, not active"
	rm /etc/mqlet/pods/oomer.yaml
	v2a_wait "v2a: the oomer pod was not removed" eval '[ -z "$(v2a_pod_name oomer)" ]'

	# podPidsLimit=16: the forker's loop of 40 gets at most 16 processes in its pod.
	pid=$(v2a_task_pid forker)
	if [ -n "$pid" ]; then
		cg=/sys/fs/cgroup$(dirname "$(v2a_cgroup_of $pid)")
		echo "forker pod $cg: pids.max $(cat $cg/pids.max), pids.current $(cat $cg/pids.current), pids.events: $(cat $cg/pids.events)"
		[ "$(cat $cg/pids.max)" = 16 ] || fail "forker pod $cg: pids.max = $(cat $cg/pids.max), want 16 (podPidsLimit)"
		[ "$(cat $cg/pids.current)" -le 16 ] || fail "forker pod $cg: pids.current = $(cat $cg/pids.current), above podPidsLimit 16"
		# Debian 12's kernel counts a refused fork in pids.events of the forking task's cgroup
		# (the container's), later kernels in the cgroup whose limit was hit (the pod's).
		cat $cg/*/pids.events $cg/pids.events | grep '^max [1-9]' >/dev/null ||
			fail "forker pod $cg: no fork refused at podPidsLimit: $(cat $cg/pids.events $cg/*/pids.events | tr '\n' ' ')"
	fi

	# systemd leaves the pods' cgroups alone: a daemon-reload and a restart of the unit neither move
	# nor kill the hog.
	local hogpid hogcg
	hogpid=$(v2a_task_pid hog)
	hogcg=$(v2a_cgroup_of "$hogpid")
	echo "hog pid $hogpid in $hogcg; mqlet in $(v2a_cgroup_of "$(systemctl show -p MainPID --value mqlet)")"
	systemctl daemon-reload
	[ "$(v2a_cgroup_of "$hogpid")" = "$hogcg" ] || fail "daemon-reload moved the hog (pid $hogpid) from $hogcg to $(v2a_cgroup_of "$hogpid")"

	# A dropped memory limit: the drop pod's container holds 64Mi under 128Mi; its new spec has
	# 16Mi and holds nothing. The old container is stopped with its grace period and replaced; the
	# pod cgroup's limit is not lowered under it (the kernel would OOM-kill it).
	local droppod
	droppod=/sys/fs/cgroup$(dirname "$(v2a_cgroup_of "$(v2a_task_pid drop)")")
	v2a_manifest drop 16Mi "exec sleep 1000000"
	dropped() { [ "$(cat $droppod/memory.max 2>/dev/null)" = 16777216 ] && v2a_running drop; }
	v2a_wait "v2a: the drop pod never ran with its new limit ($droppod/memory.max = $(cat $droppod/memory.max 2>/dev/null))" dropped
	grep -q '^oom_kill 0$' $droppod/memory.events || fail "the drop pod's old container was OOM-killed when its limit dropped: $(tr '\n' ' ' <$droppod/memory.events)"

	# Node allocatable lowered below the pods' usage by an agent restart with a larger
	# systemReserved (an OTA config change): no pod is OOM-killed, the limit is held and said so;
	# with the hog gone, it converges.
	local total reserve
	total=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
	reserve=$((total - 32 * 1024)) # KiB: 32Mi left for pods, which use over 64Mi
	sed -i "s/^systemReserved: .*/systemReserved: {memory: ${reserve}Ki}/" /etc/mqlet/mqlet.yaml
	local kills
	kills=$(awk '$1 == "oom_kill" {print $2}' $base/memory.events)
	echo "base before the restart: memory.max $(cat $base/memory.max), memory.current $(cat $base/memory.current), oom_kill $kills"
	systemctl restart mqlet || fail "systemctl restart mqlet"
	held() { journalctl -u mqlet --no-pager | grep 'not enforced yet: pods use' >/dev/null; }
	v2a_wait "v2a: no log line (and node event) that node allocatable is held above the pods' usage" held
	echo "base after the restart: memory.max $(cat $base/memory.max), memory.current $(cat $base/memory.current)"
	[ "$(cat $base/memory.max)" -gt $((32 << 20)) ] || fail "node allocatable written below the pods' usage: $base/memory.max = $(cat $base/memory.max)"
	grep -q "^oom_kill $kills\$" $base/memory.events || fail "pods were OOM-killed at the restart: $base/memory.events: $(tr '\n' ' ' <$base/memory.events) (oom_kill $kills before)"
	[ -d /proc/$hogpid ] && [ "$(v2a_cgroup_of "$hogpid")" = "$hogcg" ] || fail "the hog (pid $hogpid) did not survive the restart in $hogcg"
	rm /etc/mqlet/pods/hog.yaml
	converged() { [ "$(cat $base/memory.max)" = $((32 << 20)) ]; }
	v2a_wait "v2a: node allocatable never reached its target after the hog went ($base/memory.max = $(cat $base/memory.max), memory.current $(cat $base/memory.current))" converged
	journalctl -u mqlet --no-pager | grep 'Updated Node Allocatable limit across pods' >/dev/null || fail "no log line (and node event) that node allocatable was enforced"

	echo "--- journalctl -u mqlet (v2a)"
	journalctl -u mqlet --no-pager -o short-monotonic | grep -v 'level=DEBUG' | tail -n 40
	systemctl stop mqlet
	for t in $(ctr -n $NS tasks ls -q 2>/dev/null); do
		ctr -n $NS tasks kill -s SIGKILL "$t" 2>/dev/null
	done
}
v2a_resource_policy

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
		journalctl -u mqlet --since "$since" --no-pager | grep 'oom watcher: reading the kernel log' >/dev/null && break
		sleep 1
	done
	journalctl -u mqlet --since "$since" --no-pager | grep 'oom watcher: reading the kernel log' >/dev/null || fail "the OOM watcher did not start"
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

# --- the .deb (issue 22): install, a pod, upgrade, rollback, purge ---------------------------------
# run.sh builds two .debs of the checkout (versions 0.0.1~lane and 0.0.2~lane) into /mqlet/out/debs.
# No network in the guest: the packages' dependencies are in the image (image.sh).

# host_state prints what the host holds that a purge must restore: links, iptables rules, CNI
# files, cgroups, containerd namespaces, units and their enablement, mqlet's paths.
host_state() {
	echo "# links"
	ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | sort
	for t in nat filter; do
		echo "# iptables -t $t"
		iptables-save -t $t | grep -v '^#' | sed 's/\[[0-9]*:[0-9]*\]//'
	done
	echo "# /etc/cni/net.d"
	ls -A /etc/cni/net.d 2>/dev/null
	echo "# cgroups"
	(cd /sys/fs/cgroup && find . -mindepth 1 -maxdepth 3 -type d | grep -v '^./system.slice\|^./user.slice\|^./init.scope' | sort)
	echo "# containerd namespaces"
	ctr namespaces ls -q | sort
	echo "# units"
	systemctl list-unit-files --no-legend --no-pager | awk '{print $1, $2}' | grep -i mqlet
	ls /etc/systemd/system/multi-user.target.wants/ | sort
	echo "# paths"
	for p in /usr/bin/mqlet /lib/systemd/system/mqlet.service /etc/mqlet /var/lib/mqlet /var/lib/mqlet-purge /run/mqlet /etc/systemd/logind.conf.d/99-mqlet.conf; do
		[ -e $p ] && echo "$p"
	done
}

# running_tasks prints "container-id pid" of the running tasks of mqlet's namespace, sorted.
running_tasks() { ctr -n $NS tasks ls 2>/dev/null | awk '$3 == "RUNNING" {print $1, $2}' | sort; }

# wait_hello waits (bounded) until the local agent reports the hello pod 2/2 Running.
wait_hello() {
	for _ in $(seq 1 120); do
		mqlet pods 2>/dev/null | awk '$2 ~ /^hello/ && $3 == "2/2" && $4 == "Running" {ok=1} END {exit !ok}' && return 0
		sleep 2
	done
	return 1
}

# is_version says whether the installed mqlet reports version $1.
is_version() { case $(mqlet version 2>&1) in "mqlet $1 "*) return 0 ;; esac; return 1; }

package_lifecycle() {
	local deb1 deb2 tasks before main1 main2 wd1 wd2
	deb1=$(ls /mqlet/out/debs/mqlet_0.0.1*_amd64.deb 2>/dev/null)
	deb2=$(ls /mqlet/out/debs/mqlet_0.0.2*_amd64.deb 2>/dev/null)
	if [ -z "$deb1" ] || [ -z "$deb2" ]; then
		fail "no .debs in /mqlet/out/debs: $(ls /mqlet/out/debs 2>&1)"
		return
	fi
	# The by-hand install of the step above goes first, by its own `mqlet uninstall --purge`, so
	# the package meets a host mqlet never touched.
	systemctl stop mqlet 2>/dev/null
	/usr/local/bin/mqlet uninstall --purge --config /etc/mqlet/mqlet.yaml || fail "mqlet uninstall --purge of the by-hand install"
	rm -rf /etc/systemd/system/mqlet.service /usr/local/bin/mqlet /etc/mqlet
	hash -r # mqlet is /usr/bin/mqlet from here on
	systemctl daemon-reload
	host_state >/tmp/state-before

	echo "--- apt-get install $(basename "$deb1")"
	apt-get install -y -q -o Dpkg::Use-Pty=0 --no-install-recommends "$deb1" || fail "apt-get install $deb1"
	systemctl is-enabled --quiet mqlet || fail "mqlet is $(systemctl is-enabled mqlet) after the install, not enabled"
	systemctl is-active --quiet mqlet || fail "mqlet is $(systemctl is-active mqlet) after the install, not active"
	systemctl show -p Type,ActiveState,SubState,StatusText,WatchdogUSec,ExecMainPID,FragmentPath mqlet
	[ "$(systemctl show -p Type --value mqlet)" = notify ] || fail "the packaged unit is not Type=notify"
	case $(systemctl show -p StatusText --value mqlet) in
	running:*) ;;
	*) fail "StatusText is '$(systemctl show -p StatusText --value mqlet)', not the agent's READY status" ;;
	esac
	[ "$(systemctl show -p WatchdogUSec --value mqlet)" = 2min ] || fail "WatchdogUSec is $(systemctl show -p WatchdogUSec --value mqlet), not 2min"
	is_version v0.0.1-lane || fail "after the install, mqlet version says: $(mqlet version)"

	echo "--- the holder killed while no pod runs, under the running agent: a pod still starts"
	kill -9 "$(cat /sys/fs/cgroup/mqlet.slice/mqlet-pods.scope/holder/cgroup.procs 2>/dev/null)"
	for _ in $(seq 1 20); do # a bound, not a speed check
		systemctl is-active --quiet mqlet-pods.scope || break
		sleep 1
	done
	echo "the scope without a holder: $(systemctl is-active mqlet-pods.scope); $(ls /sys/fs/cgroup/mqlet.slice 2>&1 | tr '\n' ' ')"

	echo "--- a pod dropped into /etc/mqlet/pods"
	ctr -n $NS images import /mqlet/out/images/busybox.tar >/dev/null || fail "ctr -n $NS images import busybox.tar"
	install -m 644 $SRC/configs/pods/hello.yaml /etc/mqlet/pods/hello.yaml
	wait_hello || fail "the hello pod did not run under the packaged service"
	mqlet pods
	tasks=$(running_tasks)
	echo "running tasks:"
	echo "$tasks"
	[ "$(echo "$tasks" | grep -c .)" = 2 ] || fail "$(echo "$tasks" | grep -c .) running tasks, want the hello pod's 2"
	# The watchdog is fed: systemd's WatchdogTimestamp moves (the agent's relist loop, every 10 s).
	wd1=$(systemctl show -p WatchdogTimestampMonotonic --value mqlet)
	for _ in $(seq 1 45); do
		wd2=$(systemctl show -p WatchdogTimestampMonotonic --value mqlet)
		[ "$wd2" != "$wd1" ] && break
		sleep 2
	done
	[ "$wd2" != "$wd1" ] || fail "systemd's WatchdogTimestamp did not move in 90 s: no WATCHDOG=1 from the agent"
	echo "watchdog pinged at ${wd1}us and ${wd2}us (monotonic)"

	echo "--- upgrade: apt-get install $(basename "$deb2")"
	main1=$(systemctl show -p MainPID --value mqlet)
	apt-get install -y -q -o Dpkg::Use-Pty=0 "$deb2" || fail "apt-get install $deb2 (upgrade)"
	main2=$(systemctl show -p MainPID --value mqlet)
	systemctl is-active --quiet mqlet || fail "mqlet is $(systemctl is-active mqlet) after the upgrade"
	[ "$main1" != "$main2" ] || fail "the agent was not restarted by the upgrade (MainPID $main1)"
	is_version v0.0.2-lane || fail "after the upgrade, mqlet version says: $(mqlet version)"
	wait_hello || fail "the hello pod is not 2/2 Running after the upgrade"
	[ "$(running_tasks)" = "$tasks" ] || fail "the upgrade changed the pod's containers: before
$tasks
after
$(running_tasks)"

	echo "--- rollback: apt-get install --allow-downgrades $(basename "$deb1")"
	apt-get install -y -q -o Dpkg::Use-Pty=0 --allow-downgrades "$deb1" || fail "apt-get install --allow-downgrades $deb1 (rollback)"
	systemctl is-active --quiet mqlet || fail "mqlet is $(systemctl is-active mqlet) after the rollback"
	is_version v0.0.1-lane || fail "after the rollback, mqlet version says: $(mqlet version)"
	wait_hello || fail "the hello pod is not 2/2 Running after the rollback"
	[ "$(running_tasks)" = "$tasks" ] || fail "the rollback changed the pod's containers: before
$tasks
after
$(running_tasks)"
	# It keeps syncing: an edit of the manifest reaches the pod (a label is not a container change).
	# (Read whole, then matched: `mqlet ... | grep -q` fails under pipefail when grep exits first
	# and mqlet gets SIGPIPE.)
	sed -i 's/app: hello/app: hello-again/' /etc/mqlet/pods/hello.yaml
	local described=
	for _ in $(seq 1 60); do
		described=$(mqlet describe pod "$(mqlet pods | awk '$2 ~ /^hello/ {print $2; exit}')" 2>&1)
		case $described in *app=hello-again*) break ;; esac
		sleep 2
	done
	case $described in
	*app=hello-again*) ;;
	*) fail "after the rollback the agent did not pick up a manifest edit (label app=hello-again): $described" ;;
	esac
	systemctl show -p NRestarts,ActiveState,StatusText mqlet
	[ "$(systemctl show -p NRestarts --value mqlet)" = 0 ] || fail "the service restarted on its own (watchdog or crash): NRestarts $(systemctl show -p NRestarts --value mqlet)"

	echo "--- apt-get purge mqlet"
	apt-get purge -y -q -o Dpkg::Use-Pty=0 mqlet || fail "apt-get purge mqlet"
	for t in $tasks; do
		case $t in
		*[!0-9]*) ;;
		*) [ -d /proc/$t ] && fail "container pid $t still runs after the purge" ;;
		esac
	done
	# The manifest is the owner's file and stays; take it away to compare the rest (the node key
	# left behind would keep /etc/mqlet, which the state lists).
	[ -f /etc/mqlet/pods/hello.yaml ] || fail "the purge removed the owner's manifest /etc/mqlet/pods/hello.yaml"
	rm -f /etc/mqlet/pods/hello.yaml
	rmdir /etc/mqlet/pods /etc/mqlet 2>/dev/null
	host_state >/tmp/state-after
	if ! diff -u /tmp/state-before /tmp/state-after; then
		fail "the purge did not leave the host as it was before the install (diff above: - before, + after)"
	fi
}

step "the .deb: apt install, a pod from /etc/mqlet/pods, upgrade and rollback keep it, apt purge leaves nothing"
package_lifecycle
echo "--- journalctl -u mqlet (the package's)"
journalctl -u mqlet --no-pager -o short-monotonic | tail -n 40

step "done"
if [ ${#failed[@]} -gt 0 ]; then
	echo "${#failed[@]} check(s) failed:"
	printf '  %s\n' "${failed[@]}"
	exit 1
fi
echo "all checks passed"
