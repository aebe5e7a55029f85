#!/usr/bin/env bash
# Sets up mqlet's real test environment on a Debian machine (run as root):
#   - the Debian packages the tests use, mosquitto, iptables and
#     containernetworking-plugins (the CNI plugins) among them
#     (MQTT tests start their own brokers; a system mosquitto is stopped)
#   - a private containerd (own root, state, socket; the system one is never touched)
#   - a local plain-HTTP registry (Debian's docker-registry) on 127.0.0.1:5000
#   - test images built from busybox-static by tools/mkimage
#   - etcd (Debian's etcd-server; tests start their own, a system etcd is stopped)
#     and kube-apiserver, kube-controller-manager and kube-scheduler built by
#     scripts/kubebins.sh (minutes on a clean machine, cached after that)
#   - /run/mqlet-test/env, read by internal/testenv and by `source`
# Idempotent: on a machine where everything is already up it only checks and
# prints the environment. Stop it with scripts/testenv-down.sh.
#
# Usage: scripts/testenv.sh [--check] [--no-kube]
#   --check    also import busybox into a scratch namespace and run a container
#              on the private containerd (a smoke test of runc + overlayfs).
#   --no-kube  do not build the kube binaries (the demo and `make bench` need
#              none); binaries already built are still named in the env file.
set -euo pipefail

RUN_DIR=/run/mqlet-test
LIB_DIR=/var/lib/mqlet-test
SOCK=$RUN_DIR/containerd.sock
CTRD_CONFIG=$LIB_DIR/containerd.toml
CTRD_PID=$RUN_DIR/containerd.pid
CTRD_LOG=$LIB_DIR/containerd.log
REG_ADDR=127.0.0.1:5000
REG_CONFIG=$LIB_DIR/registry.yml
REG_PID=$RUN_DIR/registry.pid
REG_LOG=$LIB_DIR/registry.log
IMAGES=$LIB_DIR/images
BUSYBOX=/bin/busybox
ENV_FILE=$RUN_DIR/env
WAIT_SECONDS=30

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

CHECK=0
NO_KUBE=0
for arg in "$@"; do
	case $arg in
	--check) CHECK=1 ;;
	--no-kube) NO_KUBE=1 ;;
	-h | --help)
		sed -n '2,17p' "$0"
		exit 0
		;;
	*)
		echo "testenv: unknown argument: $arg" >&2
		exit 2
		;;
	esac
done

log() { echo "testenv: $*" >&2; }
die() {
	echo "testenv: ERROR: $*" >&2
	exit 1
}

[ "$(id -u)" = 0 ] || die "must run as root (containerd and runc need it)"

# --- packages ---------------------------------------------------------------

install_packages() {
	local missing=()
	command -v containerd >/dev/null || missing+=(containerd)
	command -v ctr >/dev/null || missing+=(containerd)
	command -v containerd-shim-runc-v2 >/dev/null || missing+=(containerd)
	command -v runc >/dev/null || missing+=(runc)
	command -v docker-registry >/dev/null || missing+=(docker-registry)
	command -v skopeo >/dev/null || missing+=(skopeo)
	command -v curl >/dev/null || missing+=(curl)
	# A real broker for the MQTT tests (internal/mqtttest starts its own
	# mosquitto processes) and its command-line clients.
	[ -x /usr/sbin/mosquitto ] || command -v mosquitto >/dev/null || missing+=(mosquitto)
	command -v mosquitto_pub >/dev/null || missing+=(mosquitto-clients)
	# A private dbus-daemon for the graceful-shutdown tests (agent/shutdown plays
	# systemd-logind on it).
	command -v dbus-daemon >/dev/null || missing+=(dbus)
	# The benchmarks count bytes on the wire with iptables counters; the CNI
	# plugins' NAT (bridge ipMasq, portmap) needs it too.
	command -v iptables >/dev/null || [ -x /usr/sbin/iptables ] || missing+=(iptables)
	# Pod networking tests run Debian's CNI plugins from /usr/lib/cni (bridge,
	# host-local, portmap, loopback), and nsenter/ip to look inside pods.
	[ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
	command -v nsenter >/dev/null || missing+=(util-linux)
	command -v ip >/dev/null || missing+=(iproute2)
	# The bridge's tests and the fleet bench run a real control plane
	# (internal/kubetest starts its own etcd on free ports).
	command -v etcd >/dev/null || missing+=(etcd-server)
	# `mqlet completion` is tested by completing in the real shells.
	command -v zsh >/dev/null || missing+=(zsh)
	command -v fish >/dev/null || missing+=(fish)
	# The dynamic "busybox" package also provides /bin/busybox, but a dynamic
	# binary cannot run in an image without libc.
	dpkg -s busybox-static 2>/dev/null | grep -q '^Status: install ok installed' || missing+=(busybox-static)
	[ ${#missing[@]} -eq 0 ] && return 0

	# Deduplicate: several checks map to the containerd package.
	mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
	log "installing: ${missing[*]}"
	# Keep the packages' own services (system containerd, a registry on :5000
	# that would take our port, a system mosquitto on :1883) from starting
	# during the install.
	local policy=/usr/sbin/policy-rc.d own_policy=0
	if [ ! -e $policy ]; then
		printf '#!/bin/sh\nexit 101\n' >$policy
		chmod 755 $policy
		own_policy=1
	fi
	local rc=0
	{
		apt-get update &&
			DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
	} || rc=$?
	[ $own_policy = 1 ] && rm -f $policy
	[ $rc = 0 ] || die "apt-get install ${missing[*]} failed (exit $rc)"
}

# A system mosquitto or etcd the user runs is left alone: the tests start their own brokers and
# etcds on free loopback ports and never use 1883 or 2379, and the packages this script installs
# are kept from starting by the policy-rc.d above.

# ensure_kube_bins: the kube binaries for internal/kubetest, built once per
# version by scripts/kubebins.sh (it prints its own progress).
ensure_kube_bins() {
	if [ $NO_KUBE = 1 ]; then
		# A build already cached is still worth naming; none is started.
		KUBE_BIN=$(bash "$REPO_ROOT/scripts/kubebins.sh" --cached-only 2>/dev/null) || KUBE_BIN=
		return 0
	fi
	KUBE_BIN=$(bash "$REPO_ROOT/scripts/kubebins.sh") || die "scripts/kubebins.sh failed"
}

# --- helpers ----------------------------------------------------------------

# pid_alive PIDFILE EXE_BASENAME: true when the pidfile names a live process
# running that executable (a recycled pid of another program does not count).
pid_alive() {
	local pidfile=$1 exe=$2 pid
	[ -s "$pidfile" ] || return 1
	pid=$(cat "$pidfile")
	[[ $pid =~ ^[0-9]+$ ]] || return 1
	[ -d "/proc/$pid" ] || return 1
	[ "$(basename "$(readlink "/proc/$pid/exe" 2>/dev/null)")" = "$exe" ]
}

# start_daemon PIDFILE LOGFILE CMD...: starts CMD in its own session, so it
# outlives this script and the caller's process group, and records its pid.
start_daemon() {
	local pidfile=$1 logfile=$2
	shift 2
	rm -f "$pidfile"
	# bash writes its own pid and then execs: the pid recorded is the daemon's.
	# shellcheck disable=SC2016 # $$ and $@ are for the inner bash
	setsid -f bash -c 'echo $$ >"$1"; shift; exec nohup "$@"' _ "$pidfile" "$@" \
		</dev/null >>"$logfile" 2>&1
	local i
	for ((i = 0; i < 50; i++)); do
		[ -s "$pidfile" ] && return 0
		sleep 0.1
	done
	die "$1 did not start (no pid in $pidfile); see $logfile"
}

# wait_for DESC LOGFILE PIDFILE EXE CMD...: polls CMD for up to WAIT_SECONDS.
wait_for() {
	local desc=$1 logfile=$2 pidfile=$3 exe=$4 i
	shift 4
	for ((i = 0; i < WAIT_SECONDS * 5; i++)); do
		"$@" >/dev/null 2>&1 && return 0
		if ! pid_alive "$pidfile" "$exe"; then
			tail -n 20 "$logfile" >&2 || true
			die "$desc exited during start-up; log: $logfile"
		fi
		sleep 0.2
	done
	tail -n 20 "$logfile" >&2 || true
	die "$desc did not answer within ${WAIT_SECONDS}s; log: $logfile"
}

# write_if_changed FILE: stdin becomes FILE; returns 0 when the content changed.
write_if_changed() {
	local file=$1 tmp
	tmp=$(mktemp "$file.XXXXXX")
	cat >"$tmp"
	if [ -f "$file" ] && cmp -s "$tmp" "$file"; then
		rm -f "$tmp"
		return 1
	fi
	mv "$tmp" "$file"
	return 0
}

stop_pid() {
	local pidfile=$1 pid i
	pid=$(cat "$pidfile")
	kill -TERM "$pid" 2>/dev/null || return 0
	for ((i = 0; i < 50; i++)); do
		[ -d "/proc/$pid" ] || return 0
		sleep 0.2
	done
	kill -KILL "$pid" 2>/dev/null || true
}

# --- containerd -------------------------------------------------------------

# containerd_config comes from scripts/lib/containerd-config.sh.
# shellcheck source=scripts/lib/containerd-config.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/containerd-config.sh"

# Without a connect timeout ctr waits 10s for a socket that is not there yet.
ctr_answers() { [ -S "$SOCK" ] && ctr --connect-timeout 2s --address "$SOCK" version; }

ensure_containerd() {
	local changed=0
	containerd_config scripts/testenv.sh "$LIB_DIR" "$RUN_DIR" "$SOCK" | write_if_changed "$CTRD_CONFIG" && changed=1
	if pid_alive "$CTRD_PID" containerd; then
		if [ $changed = 0 ]; then
			wait_for containerd "$CTRD_LOG" "$CTRD_PID" containerd ctr_answers
			return 0
		fi
		log "containerd config changed; restarting"
		stop_pid "$CTRD_PID"
	elif ctr_answers >/dev/null 2>&1; then
		die "something answers on $SOCK but $CTRD_PID names no live containerd; stop it and run again"
	fi
	rm -f "$SOCK" "$SOCK.ttrpc" "$RUN_DIR/containerd-debug.sock"
	log "starting containerd on $SOCK (log: $CTRD_LOG)"
	start_daemon "$CTRD_PID" "$CTRD_LOG" "$(command -v containerd)" --config "$CTRD_CONFIG"
	wait_for containerd "$CTRD_LOG" "$CTRD_PID" containerd ctr_answers
}

# --- registry ---------------------------------------------------------------

registry_config() {
	cat <<EOF
# Written by scripts/testenv.sh: mqlet's local test registry (plain HTTP, no auth).
version: 0.1
log:
  level: info
  fields:
    service: mqlet-test-registry
storage:
  filesystem:
    rootdirectory: $LIB_DIR/registry
  delete:
    enabled: true
http:
  addr: $REG_ADDR
  secret: mqlet-test-registry
EOF
}

registry_answers() { curl -fsS --max-time 2 "http://$REG_ADDR/v2/"; }

ensure_registry() {
	local changed=0
	registry_config | write_if_changed "$REG_CONFIG" && changed=1
	if pid_alive "$REG_PID" docker-registry; then
		if [ $changed = 0 ]; then
			wait_for registry "$REG_LOG" "$REG_PID" docker-registry registry_answers
			return 0
		fi
		log "registry config changed; restarting"
		stop_pid "$REG_PID"
	elif curl -sS --max-time 2 -o /dev/null "http://$REG_ADDR/v2/" 2>/dev/null; then
		die "$REG_ADDR is already served by another process (system docker-registry?); stop it and run again"
	fi
	mkdir -p "$LIB_DIR/registry"
	log "starting docker-registry on $REG_ADDR (log: $REG_LOG)"
	start_daemon "$REG_PID" "$REG_LOG" "$(command -v docker-registry)" serve "$REG_CONFIG"
	wait_for registry "$REG_LOG" "$REG_PID" docker-registry registry_answers
}

# --- images -----------------------------------------------------------------

find_go() {
	if command -v go >/dev/null; then
		command -v go
	elif [ -x /usr/local/go/bin/go ]; then
		echo /usr/local/go/bin/go
	else
		die "go is needed to build the test images (tools/mkimage) but is neither on PATH nor at /usr/local/go/bin/go"
	fi
}

ensure_images() {
	local outputs=(busybox.tar busybox-2.tar echo.tar busybox-oci.tar)
	# The stamp covers everything the archives depend on: the busybox binary,
	# the generator's source and the architecture.
	local stamp
	stamp="busybox $(sha256sum <"$BUSYBOX" | cut -d' ' -f1)
mkimage $(cat "$REPO_ROOT"/tools/mkimage/*.go | sha256sum | cut -d' ' -f1)
arch $(dpkg --print-architecture)"
	local f rebuild=0
	for f in "${outputs[@]}"; do
		[ -s "$IMAGES/$f" ] || rebuild=1
	done
	[ -f "$IMAGES/.stamp" ] && [ "$(cat "$IMAGES/.stamp")" = "$stamp" ] || rebuild=1
	[ $rebuild = 1 ] || return 0

	local gobin
	gobin=$(find_go)
	# go needs a cache directory; CI environments may not set HOME.
	export HOME=${HOME:-/root}
	log "building test images into $IMAGES"
	rm -f "$IMAGES/.stamp"
	(cd "$REPO_ROOT" && "$gobin" run ./tools/mkimage -busybox "$BUSYBOX" -out "$IMAGES") >&2 ||
		die "tools/mkimage failed"
	echo "$stamp" >"$IMAGES/.stamp"
}

# config_digest TARBALL: the image config digest recorded in a docker-archive.
config_digest() {
	tar -xOf "$1" manifest.json | grep -o '"Config":"[0-9a-f]\{64\}' | cut -d'"' -f4
}

# push IMAGE_FILE REPO:TAG: pushes unless the registry already holds this exact
# config (so a rebuilt image replaces a stale one).
push() {
	local src=$IMAGES/$1 dest=docker://$REG_ADDR/$2 want have
	want=$(config_digest "$src") || die "cannot read the config digest of $src"
	have=$(skopeo inspect --tls-verify=false --config --raw "$dest" 2>/dev/null | sha256sum | cut -d' ' -f1) || true
	[ "$have" = "$want" ] && return 0
	log "pushing $1 to $REG_ADDR/$2"
	# --insecure-policy: these are our own local images; a fresh machine may
	# lack /etc/containers/policy.json.
	skopeo --insecure-policy copy --quiet --dest-tls-verify=false "docker-archive:$src" "$dest" >&2 ||
		die "skopeo copy of $src to $dest failed"
}

smoke_check() {
	local ns=mqlet-testenv-check out
	log "smoke check: import and run busybox in namespace $ns"
	ctr --address "$SOCK" -n $ns images import "$IMAGES/busybox.tar" >/dev/null
	out=$(ctr --address "$SOCK" -n $ns run --rm mqlet.test/busybox:1 "smoke-$$" sh -c 'echo ok') ||
		die "running a container on $SOCK failed"
	ctr --address "$SOCK" -n $ns images rm --sync mqlet.test/busybox:1 >/dev/null || true
	ctr --address "$SOCK" namespaces rm $ns >/dev/null 2>&1 || true
	[ "$out" = ok ] || die "smoke container printed '$out', want 'ok'"
	log "smoke check: ok"
}

# --- main -------------------------------------------------------------------

install_packages
mkdir -p "$RUN_DIR" "$LIB_DIR" "$IMAGES"
ensure_containerd
ensure_registry
ensure_images
push busybox.tar mqlet/busybox:1
push busybox-2.tar mqlet/busybox:2
[ $CHECK = 1 ] && smoke_check
ensure_kube_bins

write_if_changed "$ENV_FILE" <<EOF || true
MQLET_TEST_CONTAINERD=$SOCK
MQLET_TEST_REGISTRY=$REG_ADDR
MQLET_TEST_IMAGES=$IMAGES
${KUBE_BIN:+MQLET_TEST_KUBE_BIN=$KUBE_BIN}
EOF
cat "$ENV_FILE"
