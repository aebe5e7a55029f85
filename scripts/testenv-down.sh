#!/usr/bin/env bash
# Stops the test environment started by scripts/testenv.sh: the private
# containerd and the local registry, each by the pid in its pidfile (never by
# process name, so the system containerd and anything else are left alone).
#
# Usage: scripts/testenv-down.sh [--purge]
#   By default containers keep running under their shims (a restarted
#   containerd reconnects to them) and /var/lib/mqlet-test is kept, so the
#   next testenv.sh needs no rebuild or push.
#   --purge  first kills and deletes every task in every namespace of the
#            private containerd, then stops the daemons, unmounts whatever is
#            still mounted under /var/lib/mqlet-test and /run/mqlet-test and
#            removes both directories. Only for a machine where no tests
#            are running: it pulls the environment from under them.
set -euo pipefail

RUN_DIR=/run/mqlet-test
LIB_DIR=/var/lib/mqlet-test
SOCK=$RUN_DIR/containerd.sock
STOP_SECONDS=15

PURGE=0
for arg in "$@"; do
	case $arg in
	--purge) PURGE=1 ;;
	-h | --help)
		sed -n '2,14p' "$0"
		exit 0
		;;
	*)
		echo "testenv-down: unknown argument: $arg" >&2
		exit 2
		;;
	esac
done

log() { echo "testenv-down: $*" >&2; }

[ "$(id -u)" = 0 ] || {
	echo "testenv-down: ERROR: must run as root" >&2
	exit 1
}

# stop NAME PIDFILE EXE_BASENAME: TERM, bounded wait, then KILL. A pidfile
# whose pid now belongs to another program is only removed.
stop() {
	local name=$1 pidfile=$2 exe=$3 pid i
	if [ ! -s "$pidfile" ]; then
		log "$name: no pidfile ($pidfile), nothing to stop"
		return 0
	fi
	pid=$(cat "$pidfile")
	if ! [[ $pid =~ ^[0-9]+$ ]] || [ ! -d "/proc/$pid" ] ||
		[ "$(basename "$(readlink "/proc/$pid/exe" 2>/dev/null)")" != "$exe" ]; then
		log "$name: pid '$pid' from $pidfile is not running $exe; removing the stale pidfile"
		rm -f "$pidfile"
		return 0
	fi
	log "$name: stopping pid $pid"
	kill -TERM "$pid" 2>/dev/null || true
	for ((i = 0; i < STOP_SECONDS * 5; i++)); do
		[ -d "/proc/$pid" ] || break
		sleep 0.2
	done
	if [ -d "/proc/$pid" ]; then
		log "$name: pid $pid still running after ${STOP_SECONDS}s; sending SIGKILL"
		kill -KILL "$pid" 2>/dev/null || true
		for ((i = 0; i < 25; i++)); do
			[ -d "/proc/$pid" ] || break
			sleep 0.2
		done
	fi
	rm -f "$pidfile"
}

# remove_all_tasks: kills every task of the private containerd so that its
# shims exit and release their rootfs mounts before the purge.
remove_all_tasks() {
	local ctr=(ctr --connect-timeout 2s --address "$SOCK") ns task
	[ -S "$SOCK" ] && "${ctr[@]}" version >/dev/null 2>&1 || return 0
	for ns in $("${ctr[@]}" namespaces ls -q); do
		for task in $("${ctr[@]}" -n "$ns" tasks ls -q); do
			log "killing task $task in namespace $ns"
			"${ctr[@]}" -n "$ns" tasks kill -s SIGKILL "$task" >/dev/null 2>&1 || true
			"${ctr[@]}" -n "$ns" tasks delete -f "$task" >/dev/null 2>&1 || true
		done
	done
}

# unmount_under DIR: unmounts every mount point below DIR, deepest first.
unmount_under() {
	local dir=$1 mp
	# Field 5 of mountinfo is the mount point (spaces escaped as \040).
	awk -v d="$dir" '$5 == d || index($5, d "/") == 1 { print $5 }' /proc/self/mountinfo |
		sort -r | while read -r mp; do
		mp=$(printf '%b' "$mp")
		log "unmounting $mp"
		umount "$mp" 2>/dev/null || umount -l "$mp" || true
	done
}

[ $PURGE = 1 ] && remove_all_tasks
stop containerd "$RUN_DIR/containerd.pid" containerd
stop registry "$RUN_DIR/registry.pid" docker-registry

# warn_leftover_shims: a task created while the purge ran keeps its shim; it
# is reported, not killed, since this script stops only what its pidfiles name.
warn_leftover_shims() {
	local f pid cmd
	for f in /proc/[0-9]*/cmdline; do
		pid=${f#/proc/}
		pid=${pid%/cmdline}
		cmd=$({ tr '\0' ' ' <"$f"; } 2>/dev/null) || continue
		if [[ $cmd == *containerd-shim*" -address $SOCK "* ]]; then
			log "WARNING: shim pid $pid still runs for $SOCK: $cmd"
		fi
	done
}

if [ $PURGE = 1 ]; then
	warn_leftover_shims
	unmount_under "$LIB_DIR"
	unmount_under "$RUN_DIR"
	log "removing $LIB_DIR and $RUN_DIR"
	rm -rf "$LIB_DIR" "$RUN_DIR"
else
	# Without a running daemon the env file would send tests to a dead socket.
	rm -f "$RUN_DIR/env"
fi
log "done"
