package kubetest

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
)

const (
	// VarKubeBin names the directory holding kube-apiserver, kube-controller-manager,
	// kube-scheduler and kubectl; scripts/testenv.sh writes it to EnvFile (from scripts/kubebins.sh).
	VarKubeBin = "MQLET_TEST_KUBE_BIN"
	// VarRequire set to "1" makes a missing binary fail the test instead of skipping it (the
	// same variable internal/testenv reads).
	VarRequire = "MQLET_TEST_REQUIRE"
	// EnvFile is the environment file scripts/testenv.sh writes.
	EnvFile = "/run/mqlet-test/env"
	// KubeCacheDir is where scripts/kubebins.sh keeps its builds, one <version>/bin per version.
	KubeCacheDir = "/var/lib/mqlet-test/kube"
)

var kubeCommands = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"}

// binaries are the resolved paths of the four programs a cluster runs, and of the kubectl of
// its version that tests drive it with.
type binaries struct {
	etcd, apiserver, controllerManager, scheduler, kubectl string
}

// findBinaries resolves the kube bin dir (opts, then $MQLET_TEST_KUBE_BIN, then EnvFile, then the
// kubebins.sh cache for the client-go version this program was built with) and etcd (opts, then
// PATH, then /usr/bin where Debian's etcd-server puts it). The error says how to get what is
// missing.
func findBinaries(opts Options) (binaries, error) {
	dir, source := opts.BinDir, "Options.BinDir"
	if dir == "" {
		dir, source = os.Getenv(VarKubeBin), "$"+VarKubeBin
	}
	if dir == "" {
		dir, source = envFileValue(EnvFile, VarKubeBin), VarKubeBin+" in "+EnvFile
	}
	if dir == "" {
		if v := kubeVersion(); v != "" {
			dir, source = filepath.Join(KubeCacheDir, v, "bin"), "the scripts/kubebins.sh cache"
		}
	}
	if dir == "" {
		return binaries{}, fmt.Errorf("no kube bin dir: set %s or run scripts/testenv.sh (it runs scripts/kubebins.sh)", VarKubeBin)
	}
	var b binaries
	for i, c := range kubeCommands {
		p := filepath.Join(dir, c)
		if fi, err := os.Stat(p); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return binaries{}, fmt.Errorf("%s not found in %s (from %s): run scripts/kubebins.sh (or scripts/testenv.sh) to build it", c, dir, source)
		}
		switch i {
		case 0:
			b.apiserver = p
		case 1:
			b.controllerManager = p
		case 2:
			b.scheduler = p
		case 3:
			b.kubectl = p
		}
	}
	b.etcd = opts.EtcdPath
	if b.etcd == "" {
		if p, err := exec.LookPath("etcd"); err == nil {
			b.etcd = p
		} else if _, err := os.Stat("/usr/bin/etcd"); err == nil {
			b.etcd = "/usr/bin/etcd"
		} else {
			return binaries{}, fmt.Errorf("etcd not found on PATH: apt-get install etcd-server (scripts/testenv.sh does)")
		}
	}
	return b, nil
}

// kubeVersion maps the client-go this program links (v0.Y.Z) to the Kubernetes release that
// kubebins.sh builds by default (v1.Y.Z). Test binaries carry no dependency list, so then the
// version comes from the go.mod of the module around the working directory.
func kubeVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, d := range info.Deps {
			if d.Path == "k8s.io/client-go" && strings.HasPrefix(d.Version, "v0.") {
				return "v1." + strings.TrimPrefix(d.Version, "v0.")
			}
		}
	}
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil {
			for _, line := range strings.Split(string(data), "\n") {
				f := strings.Fields(line)
				if len(f) >= 2 && f[0] == "k8s.io/client-go" && strings.HasPrefix(f[1], "v0.") {
					return "v1." + strings.TrimPrefix(f[1], "v0.")
				}
			}
			return ""
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

// envFileValue returns key's value from a KEY=value file (blank lines, # comments, `export` and
// one level of quotes allowed), or "" when the file or the key is missing.
func envFileValue(path, key string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(sc.Text()), "export "), "=")
		if !ok || strings.TrimSpace(k) != key {
			continue
		}
		if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
			v = v[1 : len(v)-1]
		}
		return v
	}
	return ""
}
