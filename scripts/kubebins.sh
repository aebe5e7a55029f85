#!/usr/bin/env bash
# Builds the real Kubernetes control plane the bridge's end-to-end tests and `make bench-fleet` run
# against: kube-apiserver, kube-controller-manager and kube-scheduler, and the kubectl the tests
# drive it with (of the same version: a machine's own kubectl may be any), from the Go module proxy
# (k8s.io/kubernetes cannot be required directly: its go.mod points each staging module at
# ./staging, so a throwaway module requires it and replaces every staging module with its v0.Y.Z
# release). The binaries are cached under $KUBE_DIR keyed by version (and rebuilt when this
# script's build recipe changes), so a rerun costs nothing.
#
# Usage: scripts/kubebins.sh [--cached-only] [version]
#   version        default: the k8s.io/api version in go.mod, v0.Y.Z -> v1.Y.Z
#   --cached-only  build nothing: print the bin directory if it is complete, else fail
# Prints the bin directory on stdout.
set -euo pipefail
export PATH=/usr/local/go/bin:$PATH

CACHED_ONLY=0
if [ "${1:-}" = --cached-only ]; then
	CACHED_ONLY=1
	shift
fi
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
API=$(awk '$1=="k8s.io/api"{print $2; exit}' "$REPO_ROOT/go.mod")
VERSION=${1:-v1.${API#v0.}}
MINOR=v0.${VERSION#v1.}
KUBE_DIR=${KUBE_DIR:-/var/lib/mqlet-test/kube}
BIN=$KUBE_DIR/$VERSION/bin
CMDS="kube-apiserver kube-controller-manager kube-scheduler kubectl"
# The release's own version in the binaries, as Kubernetes' release build stamps it
# (hack/lib/version.sh): without it they call themselves v0.0.0-master and /version says so.
VERSION_LDFLAGS=
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	MAJ=${VERSION#v}
	MAJ=${MAJ%%.*}
	MIN=${VERSION#v*.}
	MIN=${MIN%%.*}
	VERSION_LDFLAGS+=" -X $pkg.gitVersion=$VERSION -X $pkg.gitMajor=$MAJ -X $pkg.gitMinor=$MIN -X $pkg.gitTreeState=clean"
done
GOFLAGS_BUILD=(-trimpath -gcflags=all=-dwarf=false -ldflags "-s -w$VERSION_LDFLAGS")
# Binaries built another way (an older version of this script) are rebuilt: the recipe is kept
# beside them.
RECIPE="go build ${GOFLAGS_BUILD[*]}"

have_all() {
	for c in $CMDS; do [ -x "$BIN/$c" ] || return 1; done
	[ "$(cat "$BIN/.recipe" 2>/dev/null)" = "$RECIPE" ]
}
if have_all; then
	echo "$BIN"
	exit 0
fi
[ $CACHED_ONLY = 0 ] || exit 1

log() { echo "kubebins: $*" >&2; }
mkdir -p "$BIN"
# Two callers at once (testenv.sh and a hand-run build) would each spend minutes building the
# same thing: the second waits for the first and then finds the binaries.
exec 9>"$KUBE_DIR/$VERSION.lock"
if ! flock -n 9; then
	log "another kubebins.sh is building $VERSION; waiting for it"
	flock 9
fi
if have_all; then
	echo "$BIN"
	exit 0
fi
WORK=$(mktemp -d "$KUBE_DIR/build.XXXXXX")
PROGRESS_PID=
cleanup() {
	[ -n "$PROGRESS_PID" ] && kill "$PROGRESS_PID" 2>/dev/null
	rm -rf "$WORK"
}
trap cleanup EXIT
START=$SECONDS

STAGING="api apiextensions-apiserver apimachinery apiserver cli-runtime client-go cloud-provider
cluster-bootstrap code-generator component-base component-helpers controller-manager cri-api
cri-client csi-translation-lib dynamic-resource-allocation endpointslice externaljwt kms
kube-aggregator kube-controller-manager kube-proxy kube-scheduler kubectl kubelet metrics
mount-utils pod-security-admission sample-apiserver sample-cli-plugin sample-controller"

cd "$WORK"
{
	echo "module mqlet.local/kubebins"
	echo
	echo "go 1.26"
	echo
	echo "require k8s.io/kubernetes $VERSION"
	echo
	echo "replace ("
	for m in $STAGING; do echo "	k8s.io/$m => k8s.io/$m $MINOR"; done
	echo ")"
} >go.mod
{
	echo "//go:build tools"
	echo "package tools"
	echo "import ("
	for c in $CMDS; do echo "	_ \"k8s.io/kubernetes/cmd/$c\""; done
	echo ")"
} >tools.go

log "resolving k8s.io/kubernetes $VERSION (staging modules at $MINOR)"
# A staging module the release does not publish at $MINOR makes `go mod tidy` fail naming it;
# drop such replace lines and retry once.
if ! go mod tidy >tidy.log 2>&1; then
	bad=$(grep -o 'k8s.io/[a-z-]*@'"$MINOR"': [^"]*' tidy.log | sed 's/@.*//' | sort -u || true)
	if [ -n "$bad" ]; then
		for b in $bad; do sed -i "\#^	$b => #d" go.mod; done
		go mod tidy >tidy.log 2>&1 || { cat tidy.log >&2; exit 1; }
	else
		cat tidy.log >&2
		exit 1
	fi
fi
log "modules resolved ($((SECONDS - START))s)"
# One go build for the four commands: their shared packages are compiled once and the links
# run side by side. No debug information is made at all (-dwarf=false saves compile time; -s -w
# only strips it at link time), since nobody debugs these binaries here. -v names each package as
# it is compiled; the count is the progress shown, since a clean build takes minutes.
pkgs=()
for c in $CMDS; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
log "building $CMDS $VERSION (several minutes on a clean machine; progress every 30s)"
(
	while sleep 30; do
		log "building: $(wc -l <"$WORK/build.log") packages compiled, $((SECONDS - START))s"
	done
) >&2 & # not on stdout: a caller's $(...) would wait for the loop's sleep

PROGRESS_PID=$!
mkdir -p "$WORK/out"
if ! CGO_ENABLED=0 go build -v "${GOFLAGS_BUILD[@]}" -o "$WORK/out/" "${pkgs[@]}" 2>"$WORK/build.log"; then
	tail -n 40 "$WORK/build.log" >&2
	exit 1
fi
# mv replaces each binary at once: a cluster running the old one keeps running.
for c in $CMDS; do mv "$WORK/out/$c" "$BIN/$c"; done
echo "$RECIPE" >"$BIN/.recipe"
log "built into $BIN in $((SECONDS - START))s"
echo "$BIN"
