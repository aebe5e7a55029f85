// Package testenv connects Go tests to mqlet's real test environment: a
// private containerd, a local plain-HTTP registry and prebuilt image
// archives, all set up by scripts/testenv.sh (and stopped by
// scripts/testenv-down.sh).
//
// Tests that need the environment call Require, which skips them when it is
// missing, or fails them when MQLET_TEST_REQUIRE=1 (as CI sets it), so a
// broken environment cannot pass as a green run of skipped tests.
package testenv

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/mqlet/mqlet/agent/ctrd"
)

// Variables written by scripts/testenv.sh to EnvFile; the same names in the
// process environment take precedence over the file.
const (
	VarContainerd = "MQLET_TEST_CONTAINERD" // containerd socket path
	VarRegistry   = "MQLET_TEST_REGISTRY"   // registry host:port, plain HTTP
	VarImages     = "MQLET_TEST_IMAGES"     // directory of image archives
	// VarRequire set to "1" turns a missing environment from a skip into a failure.
	VarRequire = "MQLET_TEST_REQUIRE"

	EnvFile = "/run/mqlet-test/env"
)

// Image archive names for Env.Image, with the image reference each archive
// holds once imported. All share one busybox-static layer.
const (
	// Busybox is a docker-archive of mqlet.test/busybox:1: Cmd ["sh"],
	// Env PATH=/usr/sbin:/usr/bin:/sbin:/bin.
	Busybox    = "busybox"
	BusyboxRef = "mqlet.test/busybox:1"
	// Busybox2 is a docker-archive of mqlet.test/busybox:2: as Busybox with
	// an extra Env MQLET_IMAGE_VERSION=2, so its digest differs.
	Busybox2    = "busybox-2"
	Busybox2Ref = "mqlet.test/busybox:2"
	// Echo is a docker-archive of mqlet.test/echo:1: Entrypoint ["/bin/echo"],
	// Cmd ["hello from image"], WorkingDir /tmp.
	Echo    = "echo"
	EchoRef = "mqlet.test/echo:1"
	// BusyboxOCI is an OCI image layout archive of mqlet.test/busybox-oci:1;
	// its index.json carries the full reference in the
	// org.opencontainers.image.ref.name annotation.
	BusyboxOCI    = "busybox-oci"
	BusyboxOCIRef = "mqlet.test/busybox-oci:1"
)

// Repositories pushed to the local registry by scripts/testenv.sh; pass them
// to Env.RegistryRef. They hold the same images as Busybox and Busybox2.
const (
	RegistryBusybox  = "mqlet/busybox:1"
	RegistryBusybox2 = "mqlet/busybox:2"
)

// Env locates the parts of the test environment.
type Env struct {
	ContainerdAddress string // unix socket path of the private containerd
	Registry          string // host:port of the plain-HTTP registry
	ImagesDir         string // directory holding the image archives
}

// Image returns the path of the archive for name, one of Busybox, Busybox2,
// Echo or BusyboxOCI: ImagesDir/<name>.tar.
func (e Env) Image(name string) string {
	return filepath.Join(e.ImagesDir, name+".tar")
}

// RegistryRef returns the full reference of repoTag (e.g. RegistryBusybox)
// in the local registry, e.g. "127.0.0.1:5000/mqlet/busybox:1".
func (e Env) RegistryRef(repoTag string) string {
	return e.Registry + "/" + repoTag
}

// Require returns the test environment, or skips the test when it is not
// set up (or not usable by this process, e.g. when not root). With
// MQLET_TEST_REQUIRE=1 it fails the test instead of skipping it.
func Require(t testing.TB) Env {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the real test environment; skipped with -short (make unit)")
	}
	env, err := load(os.Getenv, EnvFile)
	if err == nil {
		err = env.check()
	}
	if err != nil {
		if os.Getenv(VarRequire) == "1" {
			t.Fatalf("mqlet test environment unavailable: %v; run scripts/testenv.sh as root first (%s=1 makes this a failure rather than a skip)", err, VarRequire)
		}
		t.Skipf("mqlet test environment unavailable: %v; run scripts/testenv.sh as root to run this test", err)
	}
	return env
}

// load takes each variable from getenv, falling back to the KEY=value lines
// of file. A missing file is only an error when a variable is left unset.
func load(getenv func(string) string, file string) (Env, error) {
	fromFile, fileErr := parseEnvFile(file)
	get := func(key string) string {
		if v := getenv(key); v != "" {
			return v
		}
		return fromFile[key]
	}
	env := Env{
		ContainerdAddress: get(VarContainerd),
		Registry:          get(VarRegistry),
		ImagesDir:         get(VarImages),
	}
	var missing []string
	for _, kv := range [][2]string{
		{VarContainerd, env.ContainerdAddress},
		{VarRegistry, env.Registry},
		{VarImages, env.ImagesDir},
	} {
		if kv[1] == "" {
			missing = append(missing, kv[0])
		}
	}
	if len(missing) > 0 {
		msg := fmt.Sprintf("%s not set in the environment", strings.Join(missing, ", "))
		if fileErr != nil {
			return Env{}, fmt.Errorf("%s, and %v", msg, fileErr)
		}
		return Env{}, fmt.Errorf("%s nor in %s", msg, file)
	}
	return env, nil
}

// parseEnvFile reads the shell-style KEY=value lines that testenv.sh writes;
// blank lines and # comments are ignored, and one level of quotes is removed.
func parseEnvFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading environment file: %w", err)
	}
	defer f.Close()
	vars := map[string]string{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, value, ok := strings.Cut(strings.TrimPrefix(line, "export "), "=")
		if !ok {
			return nil, fmt.Errorf("%s:%d: want KEY=value, got %q", path, n, line)
		}
		if len(value) >= 2 && (value[0] == '"' || value[0] == '\'') && value[len(value)-1] == value[0] {
			value = value[1 : len(value)-1]
		}
		vars[strings.TrimSpace(key)] = value
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	return vars, nil
}

// check catches the usual stale states early (daemon stopped, images not
// built, no permission on the socket) so tests skip or fail with the cause
// rather than with a dial timeout deep inside a test.
func (e Env) check() error {
	if fi, err := os.Stat(e.ImagesDir); err != nil || !fi.IsDir() {
		return fmt.Errorf("images directory %s missing", e.ImagesDir)
	}
	conn, err := net.DialTimeout("unix", e.ContainerdAddress, 5*time.Second)
	if err != nil {
		return fmt.Errorf("containerd socket %s: %w", e.ContainerdAddress, err)
	}
	conn.Close()
	return nil
}

// Namespace returns a containerd namespace unique to this test run, and
// registers a cleanup that removes everything the test left in it (tasks,
// containers and their snapshots, images, leases, content) and then the
// namespace itself. Cleanup problems are logged, not reported as failures:
// they must not hide the test's own result.
func Namespace(t testing.TB, addr string) string {
	t.Helper()
	ns := namespaceName(t.Name())
	t.Cleanup(func() { cleanupNamespace(t, addr, ns) })
	return ns
}

// namespaceName builds "mqlet-test-<test name>-<random>", restricted to what
// containerd accepts as an identifier (alphanumerics joined by single
// '.', '_' or '-', at most 76 characters).
func namespaceName(testName string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(testName) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
			dash = false
		} else if !dash {
			b.WriteByte('-')
			dash = true
		}
	}
	name := strings.Trim(b.String(), "-")
	if len(name) > 40 {
		name = strings.Trim(name[:40], "-")
	}
	if name == "" {
		name = "test"
	}
	suffix := make([]byte, 4)
	if _, err := rand.Read(suffix); err != nil {
		// crypto/rand does not fail on Linux; a fixed suffix would still be
		// a valid name.
		suffix = []byte{0, 0, 0, 0}
	}
	return "mqlet-test-" + name + "-" + hex.EncodeToString(suffix)
}

func cleanupNamespace(t testing.TB, addr, ns string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ctx = namespaces.WithNamespace(ctx, ns)
	client, err := containerd.New(addr)
	if err != nil {
		t.Logf("testenv cleanup of namespace %s: connecting to %s: %v", ns, addr, err)
		return
	}
	defer client.Close()
	logf := func(format string, args ...any) {
		t.Logf("testenv cleanup of namespace %s: "+format, append([]any{ns}, args...)...)
	}

	containers, err := client.Containers(ctx)
	if err != nil {
		logf("listing containers: %v", err)
	}
	for _, c := range containers {
		task, err := c.Task(ctx, nil)
		switch {
		case err == nil:
			// WithProcessKill sends SIGKILL to a running task and waits for
			// its exit before the delete; a separate Kill first would race
			// with that wait.
			if _, err := task.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
				logf("deleting task %s: %v", c.ID(), err)
			}
		case !errdefs.IsNotFound(err):
			logf("loading task %s: %v", c.ID(), err)
		}
		if err := c.Delete(ctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
			logf("deleting container %s: %v", c.ID(), err)
		}
	}

	imgs, err := client.ImageService().List(ctx)
	if err != nil {
		logf("listing images: %v", err)
	}
	for _, img := range imgs {
		if err := client.ImageService().Delete(ctx, img.Name, images.SynchronousDelete()); err != nil && !errdefs.IsNotFound(err) {
			logf("deleting image %s: %v", img.Name, err)
		}
	}

	ls, err := client.LeasesService().List(ctx)
	if err != nil {
		logf("listing leases: %v", err)
	}
	for _, l := range ls {
		if err := client.LeasesService().Delete(ctx, l, leases.SynchronousDelete); err != nil && !errdefs.IsNotFound(err) {
			logf("deleting lease %s: %v", l.ID, err)
		}
	}

	// Garbage collection normally removes these once images and leases are
	// gone; anything left (e.g. snapshots made by hand) would keep the
	// namespace from being deleted.
	removeSnapshots(ctx, client, logf)
	cs := client.ContentStore()
	var blobs []content.Info
	if err := cs.Walk(ctx, func(info content.Info) error {
		blobs = append(blobs, info)
		return nil
	}); err != nil {
		logf("listing content: %v", err)
	}
	for _, b := range blobs {
		if err := cs.Delete(ctx, b.Digest); err != nil && !errdefs.IsNotFound(err) {
			logf("deleting content %s: %v", b.Digest, err)
		}
	}

	if err := client.NamespaceService().Delete(ctx, ns); err != nil && !errdefs.IsNotFound(err) {
		logf("deleting the namespace: %v", err)
	}
	// The cgroups left behind: runc's default parent (/<ns>, used by plain containerd clients) and
	// the pod cgroups of agents stopped with their pods still running (/mqlet/<ns>).
	for _, rel := range []string{"/" + ns, "/mqlet/" + ns} {
		if err := ctrd.RemoveCgroupTree(rel); err != nil {
			logf("removing cgroups %s: %v", rel, err)
		}
	}
}

// removeSnapshots removes every snapshot of every snapshotter in the
// namespace. A parent cannot go before its children, so it repeats passes
// until a pass removes nothing.
func removeSnapshots(ctx context.Context, client *containerd.Client, logf func(string, ...any)) {
	plugins, err := client.IntrospectionService().Plugins(ctx, `type=="io.containerd.snapshotter.v1"`)
	if err != nil {
		logf("listing snapshotters: %v", err)
		return
	}
	for _, p := range plugins.Plugins {
		if p.InitErr != nil {
			continue
		}
		sn := client.SnapshotService(p.ID)
		var lastErr error
		for {
			var keys []string
			if err := sn.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
				keys = append(keys, info.Name)
				return nil
			}); err != nil {
				logf("listing %s snapshots: %v", p.ID, err)
				break
			}
			removed := 0
			for _, k := range keys {
				if err := sn.Remove(ctx, k); err == nil || errdefs.IsNotFound(err) {
					removed++
				} else {
					lastErr = fmt.Errorf("removing %s snapshot %s: %w", p.ID, k, err)
				}
			}
			if len(keys) == 0 {
				break
			}
			if removed == 0 {
				logf("%v", lastErr)
				break
			}
		}
	}
}

// Processes counts the processes of container id's task in containerd namespace ns, as
// containerd reports them (its own process and any exec).
func (e Env) Processes(t testing.TB, ns, id string) int {
	t.Helper()
	c, err := containerd.New(e.ContainerdAddress)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := namespaces.WithNamespace(context.Background(), ns)
	ctr, err := c.LoadContainer(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	task, err := ctr.Task(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := task.Pids(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return len(ps)
}

// RunBusybox starts `sh -c script` in container id of containerd namespace ns, from the busybox
// test image (imported already), its output in logPath, straight through containerd's client: for
// tests of what acts on a running container (stop, exec) rather than of how mqlet starts one.
func (e Env) RunBusybox(t testing.TB, ns, id, logPath, script string) {
	t.Helper()
	c, err := containerd.New(e.ContainerdAddress)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := namespaces.WithNamespace(context.Background(), ns)
	img, err := c.GetImage(ctx, BusyboxRef)
	if err != nil {
		t.Fatal(err)
	}
	ctr, err := c.NewContainer(ctx, id, containerd.WithNewSnapshot(id, img),
		containerd.WithNewSpec(oci.WithImageConfig(img), oci.WithProcessArgs("sh", "-c", script)))
	if err != nil {
		t.Fatalf("create container %s: %v", id, err)
	}
	task, err := ctr.NewTask(ctx, cio.LogFile(logPath))
	if err != nil {
		t.Fatalf("create task %s: %v", id, err)
	}
	if err := task.Start(ctx); err != nil {
		t.Fatalf("start task %s: %v", id, err)
	}
}
