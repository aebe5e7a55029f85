// Command mkimages builds the container images the sig-node conformance specs run, from sources
// reachable without Kubernetes' image registry: Debian's static busybox and an agnhost binary built
// from k8s.io/kubernetes/test/images/agnhost (scripts/conformance-images.sh builds it). Each image
// is written as a docker-archive (what skopeo copies into the local registry) named
// <name>_<tag>.tar, with the name and tag test/utils/image/manifest.go gives it, so a
// KUBE_TEST_REPO_LIST pointing the suite at the registry finds them.
//
// Every image has the busybox applets in /bin (agnhost's upstream image is alpine with a shell,
// and specs run `sh -c` in it); agnhost's have a curl stand-in too (curlStandIn). Entries have a fixed mtime and owner, so the same inputs give the
// same digests and a rerun pushes nothing.
//
// Usage:
//
//	go run ./tools/conformance/mkimages -busybox /bin/busybox -agnhost AGNHOST -porter-dir DIR \
//	    -agnhost-tags 2.66.1,2.55 -busybox-tag 1.37.0-2 -pause-tag 3.10.2 -nonroot-tag 1.5 \
//	    -images-src K8S/test/images -kitten-tag 1.8 -nautilus-tag 1.8 -nginx-tags 1.27.0-2,1.28.0-2 -out DIR
//
// kitten and nautilus are agnhost serving its test-webserver with their html files in / (as
// upstream's Dockerfiles build them on agnhost). nginx is not nginx: it is busybox httpd serving
// /usr/share/nginx/html on port 80 in the foreground, which is all the specs that name it use it
// for (a long-running pod that answers HTTP on 80; a changed image tag for the update specs).
package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"
)

var epoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

type entry struct {
	name, link string
	typ        byte
	mode       int64
	data       []byte
}

func dir(name string, mode int64) entry { return entry{name: name + "/", typ: tar.TypeDir, mode: mode} }
func file(name string, mode int64, data []byte) entry {
	return entry{name: name, typ: tar.TypeReg, mode: mode, data: data}
}
func symlink(name, target string) entry {
	return entry{name: name, typ: tar.TypeSymlink, mode: 0o777, link: target}
}

type config struct {
	User       string   `json:"User,omitempty"`
	Env        []string `json:"Env,omitempty"`
	Entrypoint []string `json:"Entrypoint,omitempty"`
	Cmd        []string `json:"Cmd,omitempty"`
	WorkingDir string   `json:"WorkingDir,omitempty"`
}

type image struct {
	name, tag string
	extra     []entry // after the busybox base, in this order
	config    config
}

func main() {
	busybox := flag.String("busybox", "/bin/busybox", "a statically linked busybox (Debian's busybox-static)")
	agnhost := flag.String("agnhost", "", "a statically linked agnhost binary")
	porterDir := flag.String("porter-dir", "", "k8s.io/kubernetes/test/images/agnhost/porter (its localhost.crt and .key go into agnhost's image, as upstream)")
	agnhostTags := flag.String("agnhost-tags", "", "comma-separated tags of the agnhost image")
	busyboxTag := flag.String("busybox-tag", "", "tag of the busybox image")
	pauseTag := flag.String("pause-tag", "", "tag of the pause image")
	nonrootTag := flag.String("nonroot-tag", "", "tag of the nonroot image (busybox as uid 1234)")
	imagesSrc := flag.String("images-src", "", "k8s.io/kubernetes/test/images (kitten/html and nautilus/html come from it)")
	kittenTag := flag.String("kitten-tag", "", "tag of the kitten image")
	nautilusTag := flag.String("nautilus-tag", "", "tag of the nautilus image")
	nginxTags := flag.String("nginx-tags", "", "comma-separated tags of the nginx image (busybox httpd on port 80)")
	nnp := flag.String("nnp", "", "a statically linked nnp (k8s.io/kubernetes/test/images/nonewprivs), for the nonewprivs image")
	nonewprivsTag := flag.String("nonewprivs-tag", "", "tag of the nonewprivs image (nnp, setuid root, prints its effective uid)")
	out := flag.String("out", "", "directory for the archives")
	flag.Parse()
	web := webImages{src: *imagesSrc, kittenTag: *kittenTag, nautilusTag: *nautilusTag, nginxTags: *nginxTags,
		nnp: *nnp, nonewprivsTag: *nonewprivsTag}
	if err := run(*busybox, *agnhost, *porterDir, *agnhostTags, *busyboxTag, *pauseTag, *nonrootTag, web, *out); err != nil {
		fmt.Fprintln(os.Stderr, "mkimages:", err)
		os.Exit(1)
	}
}

// webImages are the images that serve HTTP: kitten and nautilus (agnhost's test-webserver with
// upstream's html files) and nginx (busybox httpd).
type webImages struct {
	src, kittenTag, nautilusTag, nginxTags string
	// nnp and nonewprivsTag make the nonewprivs image (not a web one, but built from upstream's
	// sources the same way), when both are given.
	nnp, nonewprivsTag string
}

func run(busyboxPath, agnhostPath, porterDir, agnhostTags, busyboxTag, pauseTag, nonrootTag string, web webImages, out string) error {
	if out == "" || agnhostPath == "" || porterDir == "" || agnhostTags == "" || busyboxTag == "" || pauseTag == "" || nonrootTag == "" ||
		web.src == "" || web.kittenTag == "" || web.nautilusTag == "" || web.nginxTags == "" {
		return fmt.Errorf("every flag is required (see -h)")
	}
	base, err := busyboxBase(busyboxPath)
	if err != nil {
		return err
	}
	agn, err := readStatic(agnhostPath)
	if err != nil {
		return err
	}
	var porter []entry
	for _, f := range []string{"localhost.crt", "localhost.key"} {
		b, err := os.ReadFile(filepath.Join(porterDir, f))
		if err != nil {
			return fmt.Errorf("agnhost's porter files: %w", err)
		}
		porter = append(porter, file(f, 0o644, b))
	}
	var images []image
	for _, tag := range strings.Split(agnhostTags, ",") {
		extra := append([]entry{file("agnhost", 0o755, agn), symlink("agnhost-2", "agnhost"), dir("uploads", 0o755),
			file("usr/bin/curl", 0o755, []byte(curlStandIn))}, porter...)
		images = append(images, image{name: "agnhost", tag: tag, extra: extra,
			config: config{Env: []string{defaultPath}, Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}}})
	}
	images = append(images,
		image{name: "busybox", tag: busyboxTag, config: config{Env: []string{defaultPath}, Cmd: []string{"sh"}}},
		image{name: "nonroot", tag: nonrootTag, config: config{Env: []string{defaultPath}, Cmd: []string{"sh"}, User: "1234"}},
	)
	if web.nnp != "" && web.nonewprivsTag != "" {
		// Upstream's: nnp setuid root in /usr/local/bin, run as its CMD; a container running it as
		// uid 1000 sees uid 0 unless allowPrivilegeEscalation false (no_new_privs) stops the setuid.
		nnpBin, err := readStatic(web.nnp)
		if err != nil {
			return err
		}
		images = append(images, image{name: "nonewprivs", tag: web.nonewprivsTag,
			extra:  []entry{dir("usr/local", 0o755), dir("usr/local/bin", 0o755), file("usr/local/bin/nnp", 0o4755, nnpBin)},
			config: config{Env: []string{defaultPath}, Cmd: []string{"nnp"}}})
	}
	images = append(images,
		// The pause image runs agnhost's pause (sleeps until a signal, reaps children) as /pause.
		image{name: "pause", tag: pauseTag, extra: []entry{file("pause", 0o755, agn)},
			config: config{Env: []string{defaultPath}, Entrypoint: []string{"/pause", "pause"}}},
	)
	for _, w := range []struct{ name, tag string }{{"kitten", web.kittenTag}, {"nautilus", web.nautilusTag}} {
		extra := []entry{file("agnhost", 0o755, agn)}
		for _, f := range []string{w.name + ".jpg", "data.json"} {
			b, err := os.ReadFile(filepath.Join(web.src, w.name, "html", f))
			if err != nil {
				return fmt.Errorf("the %s image's files: %w", w.name, err)
			}
			extra = append(extra, file(f, 0o644, b))
		}
		images = append(images, image{name: w.name, tag: w.tag, extra: extra,
			config: config{Env: []string{defaultPath}, Entrypoint: []string{"/agnhost"}, Cmd: []string{"test-webserver"}}})
	}
	for _, tag := range strings.Split(web.nginxTags, ",") {
		extra := []entry{dir("usr/share", 0o755), dir("usr/share/nginx", 0o755), dir("usr/share/nginx/html", 0o755),
			file("usr/share/nginx/html/index.html", 0o644, []byte("<html><body>mqlet conformance nginx stand-in "+tag+"</body></html>\n"))}
		images = append(images, image{name: "nginx", tag: tag, extra: extra,
			config: config{Env: []string{defaultPath}, Cmd: []string{"httpd", "-f", "-v", "-p", "80", "-h", "/usr/share/nginx/html"}}})
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	for _, im := range images {
		layer, err := writeTar(append(append([]entry{}, base...), im.extra...))
		if err != nil {
			return fmt.Errorf("%s:%s: %w", im.name, im.tag, err)
		}
		cfg, err := json.Marshal(map[string]any{
			"architecture": runtime.GOARCH, "os": "linux", "created": epoch,
			"config": im.config,
			"rootfs": map[string]any{"type": "layers", "diff_ids": []string{digest(layer)}},
		})
		if err != nil {
			return err
		}
		archive, err := dockerArchive(im.name+":"+im.tag, cfg, layer)
		if err != nil {
			return err
		}
		dst := filepath.Join(out, im.name+"_"+im.tag+".tar")
		tmp := dst + ".tmp"
		if err := os.WriteFile(tmp, archive, 0o644); err != nil {
			return err
		}
		if err := os.Rename(tmp, dst); err != nil {
			return err
		}
		fmt.Printf("%s %s:%s\n", dst, im.name, im.tag)
	}
	return nil
}

func readStatic(path string) ([]byte, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading %s as ELF: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return nil, fmt.Errorf("%s is dynamically linked; the images hold no libc", path)
		}
	}
	return os.ReadFile(path)
}

// curlStandIn is agnhost's curl: upstream's image (alpine) has one, and the lifecycle hook specs'
// exec hooks run `curl http://HOST:8080/echo?msg=...`. Debian's curl is not static, so the
// stand-in is busybox wget, which GETs the URL and prints the body as `curl URL` does. It takes a
// URL only: no curl options.
const curlStandIn = `#!/bin/sh
# mqlet's conformance images: curl URL, as busybox wget (no curl options)
exec /bin/wget -q -O - "$@"
`

// busyboxBase is the root filesystem every image starts from: busybox in /bin with a link per
// applet, /etc/passwd and /etc/group with the users agnhost's upstream image defines
// (user-defined-in-image uid 1000 in group-defined-in-image gid 50000; specs check them), /tmp.
func busyboxBase(path string) ([]entry, error) {
	bin, err := readStatic(path)
	if err != nil {
		return nil, err
	}
	listOut, err := exec.Command(path, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list: %w", path, err)
	}
	applets := map[string]bool{}
	for _, a := range strings.Fields(string(listOut)) {
		if a != "busybox" && !strings.Contains(a, "/") {
			applets[a] = true
		}
	}
	names := make([]string, 0, len(applets))
	for a := range applets {
		names = append(names, a)
	}
	sort.Strings(names)
	es := []entry{dir("bin", 0o755), file("bin/busybox", 0o755, bin)}
	for _, a := range names {
		es = append(es, entry{name: "bin/" + a, typ: tar.TypeLink, mode: 0o755, link: "bin/busybox"})
	}
	es = append(es,
		dir("etc", 0o755),
		file("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\nuser-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")),
		file("etc/group", 0o644, []byte("root:x:0:\nuser-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\nnogroup:x:65534:\n")),
		dir("home", 0o755), dir("home/user-defined-in-image", 0o755),
		dir("root", 0o700), dir("tmp", 0o1777), dir("usr", 0o755), dir("usr/bin", 0o755), dir("var", 0o755),
	)
	return es, nil
}

func writeTar(es []entry) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range es {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link, Size: int64(len(e.data)),
			ModTime: epoch, Format: tar.FormatPAX}
		if e.name == "home/user-defined-in-image/" {
			h.Uid, h.Gid = 1000, 1000
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// dockerArchive is the `docker save` layout: manifest.json, the config and one layer.
func dockerArchive(ref string, cfg, layer []byte) ([]byte, error) {
	cfgName := strings.TrimPrefix(digest(cfg), "sha256:") + ".json"
	layerName := strings.TrimPrefix(digest(layer), "sha256:") + "/layer.tar"
	manifest, err := json.Marshal([]map[string]any{{"Config": cfgName, "RepoTags": []string{ref}, "Layers": []string{layerName}}})
	if err != nil {
		return nil, err
	}
	return writeTar([]entry{
		file(cfgName, 0o644, cfg),
		dir(strings.TrimSuffix(layerName, "/layer.tar"), 0o755),
		file(layerName, 0o644, layer),
		file("manifest.json", 0o644, manifest),
	})
}
