#!/usr/bin/env bash
# Builds Kubernetes' e2e conformance suite for `make conformance`: e2e.test (a `go test -c` of
# k8s.io/kubernetes/test/e2e) and the ginkgo runner at the version k8s.io/kubernetes' go.mod
# requires, both from the Go module proxy through a throwaway module (the way scripts/kubebins.sh
# builds the control plane: k8s.io/kubernetes' go.mod points each staging module at ./staging, so
# every one is replaced with its v0.Y.Z release). Cached under $CONF_DIR keyed by version and
# rebuilt only when this recipe changes: a clean build of e2e.test takes half an hour on a loaded
# 2-core machine.
#
# With --ci it builds the CI subset's suite instead (`make conformance-ci`, docs/testing.md "The CI
# subset"): the test main in tools/conformance/testdata/cisuite, which imports the suite's set-up
# and the spec packages test/e2e/common and test/e2e/node only (a quarter less to compile), into
# $CONF_DIR/<version>/ci-bin (still named e2e.test, beside its own ginkgo), keyed by the same
# recipe plus that file's digest.
#
# Usage: scripts/conformance-bins.sh [--cached-only] [--ci] [version]
#   version        default: the k8s.io/api version in go.mod, v0.Y.Z -> v1.Y.Z
#   --cached-only  build nothing: print the bin directory if it is complete, else fail
#   --ci           the CI subset's suite
# Prints the bin directory (holding e2e.test and ginkgo) on stdout.
set -euo pipefail
export PATH=/usr/local/go/bin:$PATH

CACHED_ONLY=0
CI=0
while [ $# -gt 0 ]; do
	case $1 in
	--cached-only) CACHED_ONLY=1 ;;
	--ci) CI=1 ;;
	-*)
		echo "conformance-bins: unknown option $1" >&2
		exit 2
		;;
	*) break ;;
	esac
	shift
done
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
API=$(awk '$1=="k8s.io/api"{print $2; exit}' "$REPO_ROOT/go.mod")
VERSION=${1:-v1.${API#v0.}}
MINOR=v0.${VERSION#v1.}
CONF_DIR=${CONF_DIR:-/var/lib/mqlet-test/conformance}
BIN=$CONF_DIR/$VERSION/bin
CI_SRC=$REPO_ROOT/tools/conformance/testdata/cisuite/cisuite_test.go
if [ $CI = 1 ]; then
	BIN=$CONF_DIR/$VERSION/ci-bin
fi
# The release's version stamped in, as hack/lib/version.sh does: the suite logs it and compares
# it with the server's.
MAJ=${VERSION#v}
MAJ=${MAJ%%.*}
MIN=${VERSION#v*.}
MIN=${MIN%%.*}
VERSION_LDFLAGS=
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	VERSION_LDFLAGS+=" -X $pkg.gitVersion=$VERSION -X $pkg.gitMajor=$MAJ -X $pkg.gitMinor=$MIN -X $pkg.gitTreeState=clean"
done
GOFLAGS_BUILD=(-trimpath -gcflags=all=-dwarf=false -ldflags "-s -w$VERSION_LDFLAGS")
SUITE_PKG=k8s.io/kubernetes/test/e2e
RECIPE="go test -c ${GOFLAGS_BUILD[*]} $SUITE_PKG; go build github.com/onsi/ginkgo/v2/ginkgo"
if [ $CI = 1 ]; then
	# The CI subset compiles with the flags conformance-images.sh builds agnhost with (-trimpath,
	# CGO_ENABLED=0, DWARF kept; only the link's flags differ) from the same module graph, so on a
	# cold machine the k8s.io packages both need are compiled once.
	GOFLAGS_BUILD=(-trimpath -ldflags "-s -w$VERSION_LDFLAGS")
	SUITE_PKG=./cisuite
	RECIPE="go test -c ${GOFLAGS_BUILD[*]} cisuite $(sha256sum <"$CI_SRC" | cut -d' ' -f1); go build github.com/onsi/ginkgo/v2/ginkgo"
fi

have_all() {
	[ -x "$BIN/e2e.test" ] && [ -x "$BIN/ginkgo" ] &&
		[ "$(cat "$BIN/.recipe" 2>/dev/null)" = "$RECIPE" ]
}
if have_all; then
	echo "$BIN"
	exit 0
fi
[ $CACHED_ONLY = 0 ] || exit 1

log() { echo "conformance-bins: $*" >&2; }
mkdir -p "$BIN"
# Two builds of the same version at once would each spend half an hour: the second waits.
exec 9>"$CONF_DIR/$VERSION$([ $CI = 0 ] || echo -ci).lock"
if ! flock -n 9; then
	log "another conformance-bins.sh is building $VERSION; waiting for it"
	flock 9
fi
if have_all; then
	echo "$BIN"
	exit 0
fi
WORK=$(mktemp -d "$CONF_DIR/build.XXXXXX")
PROGRESS_PID=
cleanup() {
	[ -n "$PROGRESS_PID" ] && kill "$PROGRESS_PID" 2>/dev/null
	rm -rf "$WORK"
}
trap cleanup EXIT
START=$SECONDS
cd "$WORK"

# k8s.io/kubernetes' own go.mod names its staging modules (replace k8s.io/X => ./staging/...).
go mod download -json "k8s.io/kubernetes@$VERSION" >dl.json
KMOD=$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p' dl.json)
STAGING=$(sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$KMOD" | sort -u)
[ -n "$STAGING" ] || { log "no staging modules found in $KMOD"; exit 1; }
{
	echo "module mqlet.local/conformancebins"
	echo
	echo "go 1.26"
	echo
	echo "require k8s.io/kubernetes $VERSION"
	echo
	echo "replace ("
	for m in $STAGING; do echo "	$m => $m $MINOR"; done
	echo ")"
} >go.mod
# The suite's test main imports every test package; tidy only sees what this module's files
# import, so one file imports the suite's packages (the list e2e_test.go imports) and the ginkgo CLI.
KSRC=$(go mod download -json "k8s.io/kubernetes@$VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
# (--ci: the cisuite package is in this module, so tidy sees its imports itself.)
{
	echo "//go:build tools"
	echo "package tools"
	echo "import ("
	echo "	_ \"github.com/onsi/ginkgo/v2/ginkgo\""
	[ $CI = 1 ] || sed -n '/^import (/,/^)/p' "$KSRC/test/e2e/e2e_test.go" |
		grep -o '"k8s.io/kubernetes/[^"]*"' | sort -u | sed 's/^/	_ /'
	echo ")"
} >tools.go
if [ $CI = 1 ]; then
	mkdir cisuite
	cp "$CI_SRC" cisuite/
fi

log "resolving k8s.io/kubernetes $VERSION (staging modules at $MINOR)"
# A staging module the release does not publish at $MINOR makes tidy fail naming it: drop its
# replace line and retry.
for try in 1 2 3; do
	if go mod tidy >tidy.log 2>&1; then break; fi
	bad=$(grep -o 'k8s.io/[a-z0-9-]*@'"$MINOR"': [^"]*' tidy.log | sed 's/@.*//' | sort -u || true)
	if [ -z "$bad" ] || [ $try = 3 ]; then
		cat tidy.log >&2
		exit 1
	fi
	for b in $bad; do sed -i "\#^	$b => #d" go.mod; done
done
GINKGO_VERSION=$(go list -m -f '{{.Version}}' github.com/onsi/ginkgo/v2)
log "modules resolved ($((SECONDS - START))s); ginkgo $GINKGO_VERSION"

mkdir -p out
CGO_ENABLED=0 go build "${GOFLAGS_BUILD[@]}" -o out/ginkgo github.com/onsi/ginkgo/v2/ginkgo
log "ginkgo built ($((SECONDS - START))s); building e2e.test from $SUITE_PKG (progress every 60s)"
(
	while sleep 60; do
		log "building e2e.test: $((SECONDS - START))s"
	done
) >&2 &
PROGRESS_PID=$!
if ! CGO_ENABLED=0 go test -c -o out/e2e.test "${GOFLAGS_BUILD[@]}" "$SUITE_PKG" 2>build.log; then
	tail -n 40 build.log >&2
	exit 1
fi
mv out/ginkgo "$BIN/ginkgo"
mv out/e2e.test "$BIN/e2e.test"
echo "$GINKGO_VERSION" >"$BIN/.ginkgo-version"
echo "$RECIPE" >"$BIN/.recipe"
log "built into $BIN in $((SECONDS - START))s"
echo "$BIN"
