#!/usr/bin/env bash
# Builds the images the sig-node conformance specs run and pushes them into the test registry
# (scripts/testenv.sh's, 127.0.0.1:5000), then writes the KUBE_TEST_REPO_LIST file that points
# the suite at them. Sources: agnhost built as a static Go binary from
# k8s.io/kubernetes/test/images/agnhost at the control plane's version (through a throwaway module,
# as scripts/kubebins.sh does; cached under $CONF_DIR/<version>/agnhost), Debian's busybox-static.
# Names and tags come from that version's test/utils/image/manifest.go. Images already in the
# registry with the same config digest are not pushed again.
#
# Usage: scripts/conformance-images.sh [version]   (default: from go.mod's k8s.io/api)
# Prints the repo list file on stdout.
set -euo pipefail
export PATH=/usr/local/go/bin:$PATH

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
API=$(awk '$1=="k8s.io/api"{print $2; exit}' "$REPO_ROOT/go.mod")
VERSION=${1:-v1.${API#v0.}}
MINOR=v0.${VERSION#v1.}
CONF_DIR=${CONF_DIR:-/var/lib/mqlet-test/conformance}
REGISTRY=${MQLET_TEST_REGISTRY:-127.0.0.1:5000}
BUSYBOX=${BUSYBOX:-/bin/busybox}
OUT=$CONF_DIR/$VERSION
AGN_DIR=$OUT/agnhost
log() { echo "conformance-images: $*" >&2; }
die() {
	echo "conformance-images: ERROR: $*" >&2
	exit 1
}
command -v skopeo >/dev/null || die "skopeo is not installed (scripts/testenv.sh installs it)"
mkdir -p "$AGN_DIR"
START=$SECONDS

KSRC=$(go mod download -json "k8s.io/kubernetes@$VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -d "$KSRC" ] || die "k8s.io/kubernetes@$VERSION is not in the module cache"
MANIFEST=$KSRC/test/utils/image/manifest.go
# configs[Agnhost] = Config{list.PromoterE2eRegistry, "agnhost", "2.66.1"} -> 2.66.1
tag_of() {
	sed -n 's/^[[:space:]]*configs\['"$1"'\] = Config{list\.[A-Za-z0-9]*, "[^"]*", "\([^"]*\)"}.*/\1/p' "$MANIFEST"
}
AGNHOST_TAG=$(tag_of Agnhost)
AGNHOST_PREV_TAG=$(tag_of AgnhostPrev)
BUSYBOX_TAG=$(tag_of BusyBox)
PAUSE_TAG=$(tag_of Pause)
NONROOT_TAG=$(tag_of NonRoot)
KITTEN_TAG=$(tag_of Kitten)
NAUTILUS_TAG=$(tag_of Nautilus)
NGINX_TAG=$(tag_of Nginx)
NGINX_NEW_TAG=$(tag_of NginxNew)
NONEWPRIVS_TAG=$(tag_of Nonewprivs)
for v in AGNHOST_TAG AGNHOST_PREV_TAG BUSYBOX_TAG PAUSE_TAG NONROOT_TAG KITTEN_TAG NAUTILUS_TAG NGINX_TAG NGINX_NEW_TAG NONEWPRIVS_TAG; do
	[ -n "${!v}" ] || die "no $v in $MANIFEST"
done

# --- agnhost, a static binary, cached per version and recipe ---------------------------------
RECIPE="CGO_ENABLED=0 go build -trimpath -ldflags=-s -w k8s.io/kubernetes/test/images/agnhost"
if [ ! -x "$AGN_DIR/agnhost" ] || [ "$(cat "$AGN_DIR/.recipe" 2>/dev/null)" != "$RECIPE" ]; then
	exec 9>"$OUT/agnhost.lock"
	flock 9
	if [ ! -x "$AGN_DIR/agnhost" ] || [ "$(cat "$AGN_DIR/.recipe" 2>/dev/null)" != "$RECIPE" ]; then
		WORK=$(mktemp -d "$OUT/agnhost-build.XXXXXX")
		trap 'rm -rf "$WORK"' EXIT
		STAGING=$(sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$KSRC/go.mod" | sort -u)
		{
			echo "module mqlet.local/agnhost"
			echo
			echo "go 1.26"
			echo
			echo "require k8s.io/kubernetes $VERSION"
			echo
			echo "replace ("
			for m in $STAGING; do echo "	$m => $m $MINOR"; done
			echo ")"
		} >"$WORK/go.mod"
		printf '//go:build tools\npackage tools\nimport _ "k8s.io/kubernetes/test/images/agnhost"\n' >"$WORK/tools.go"
		log "building agnhost $AGNHOST_TAG from k8s.io/kubernetes $VERSION"
		(
			cd "$WORK"
			for try in 1 2 3; do
				if go mod tidy >tidy.log 2>&1; then break; fi
				bad=$(grep -o 'k8s.io/[a-z0-9-]*@'"$MINOR"': [^"]*' tidy.log | sed 's/@.*//' | sort -u || true)
				[ -n "$bad" ] && [ $try != 3 ] || { cat tidy.log >&2; exit 1; }
				for b in $bad; do sed -i "\#^	$b => #d" go.mod; done
			done
			CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o agnhost k8s.io/kubernetes/test/images/agnhost
		) || die "building agnhost failed"
		mv "$WORK/agnhost" "$AGN_DIR/agnhost"
		echo "$RECIPE" >"$AGN_DIR/.recipe"
		log "agnhost built in $((SECONDS - START))s"
	fi
fi

# --- nnp (test/images/nonewprivs: one file, the standard library only), static ----------------
NNP=$OUT/nnp/nnp
if [ ! -x "$NNP" ]; then
	NWORK=$(mktemp -d "$OUT/nnp-build.XXXXXX")
	cp "$KSRC/test/images/nonewprivs/nnp.go" "$NWORK/"
	printf 'module mqlet.local/nnp\n\ngo 1.26\n' >"$NWORK/go.mod"
	(cd "$NWORK" && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o nnp .) || die "building nnp failed"
	mkdir -p "$OUT/nnp"
	mv "$NWORK/nnp" "$NNP"
	rm -rf "$NWORK"
fi

# --- the images --------------------------------------------------------------------------------
ARCHIVES=$OUT/images
(cd "$REPO_ROOT" && go run ./tools/conformance/mkimages -busybox "$BUSYBOX" -agnhost "$AGN_DIR/agnhost" \
	-porter-dir "$KSRC/test/images/agnhost/porter" -agnhost-tags "$AGNHOST_TAG,$AGNHOST_PREV_TAG" \
	-busybox-tag "$BUSYBOX_TAG" -pause-tag "$PAUSE_TAG" -nonroot-tag "$NONROOT_TAG" -images-src "$KSRC/test/images" \
	-kitten-tag "$KITTEN_TAG" -nautilus-tag "$NAUTILUS_TAG" -nginx-tags "$NGINX_TAG,$NGINX_NEW_TAG" \
	-nnp "$NNP" -nonewprivs-tag "$NONEWPRIVS_TAG" -out "$ARCHIVES") >/dev/null ||
	die "tools/conformance/mkimages failed"

# The e2e images under <registry>/e2e-test-images (promoterE2eRegistry), pause under
# <registry>/k8s (gcRegistry), as upstream splits them.
push() {
	local archive=$ARCHIVES/$1 dest=docker://$REGISTRY/$2 want have
	want=$(tar -xOf "$archive" manifest.json | sed 's/.*"Config":"\([0-9a-f]*\)\.json".*/\1/')
	have=$(skopeo inspect --tls-verify=false --config --raw "$dest" 2>/dev/null | sha256sum | cut -d' ' -f1) || true
	[ "$have" = "$want" ] && return 0
	log "pushing $1 to $REGISTRY/$2"
	skopeo --insecure-policy copy --quiet --dest-tls-verify=false "docker-archive:$archive" "$dest" >&2 ||
		die "skopeo copy of $archive to $dest failed"
}
push "agnhost_$AGNHOST_TAG.tar" "e2e-test-images/agnhost:$AGNHOST_TAG"
push "agnhost_$AGNHOST_PREV_TAG.tar" "e2e-test-images/agnhost:$AGNHOST_PREV_TAG"
push "busybox_$BUSYBOX_TAG.tar" "e2e-test-images/busybox:$BUSYBOX_TAG"
push "nonroot_$NONROOT_TAG.tar" "e2e-test-images/nonroot:$NONROOT_TAG"
push "pause_$PAUSE_TAG.tar" "k8s/pause:$PAUSE_TAG"
push "kitten_$KITTEN_TAG.tar" "e2e-test-images/kitten:$KITTEN_TAG"
push "nautilus_$NAUTILUS_TAG.tar" "e2e-test-images/nautilus:$NAUTILUS_TAG"
push "nginx_$NGINX_TAG.tar" "e2e-test-images/nginx:$NGINX_TAG"
push "nginx_$NGINX_NEW_TAG.tar" "e2e-test-images/nginx:$NGINX_NEW_TAG"
push "nonewprivs_$NONEWPRIVS_TAG.tar" "e2e-test-images/nonewprivs:$NONEWPRIVS_TAG"

# Registries the suite names but nothing here serves keep pointing at nothing reachable: a spec
# using one fails on its image pull, which docs/conformance.md then says.
LIST=$OUT/repo-list.yaml
cat >"$LIST.tmp" <<EOL
promoterE2eRegistry: $REGISTRY/e2e-test-images
gcRegistry: $REGISTRY/k8s
gcEtcdRegistry: $REGISTRY/k8s
buildImageRegistry: $REGISTRY/build-image
sigStorageRegistry: $REGISTRY/sig-storage
privateRegistry: $REGISTRY/private
invalidRegistry: invalid.registry.k8s.io/invalid
dockerLibraryRegistry: $REGISTRY/library
cloudProviderGcpRegistry: $REGISTRY/cloud-provider-gcp
EOL
mv "$LIST.tmp" "$LIST"
log "images ready in $REGISTRY ($((SECONDS - START))s); repo list $LIST"
echo "$LIST"
