package testenv

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/defaults"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/identifiers"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
)

func TestLoadPrefersProcessEnvironmentOverFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "env")
	content := "# written by testenv.sh\n\n" +
		"MQLET_TEST_CONTAINERD=/from/file.sock\n" +
		"export MQLET_TEST_REGISTRY='127.0.0.1:5000'\n" +
		"MQLET_TEST_IMAGES=\"/images dir\"\n"
	if err := os.WriteFile(file, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	getenv := func(key string) string {
		if key == VarContainerd {
			return "/from/env.sock"
		}
		return ""
	}
	env, err := load(getenv, file)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	want := Env{ContainerdAddress: "/from/env.sock", Registry: "127.0.0.1:5000", ImagesDir: "/images dir"}
	if env != want {
		t.Fatalf("load = %+v, want %+v", env, want)
	}
	if got, want := env.Image(Echo), "/images dir/echo.tar"; got != want {
		t.Errorf("Image(Echo) = %q, want %q", got, want)
	}
	if got, want := env.RegistryRef(RegistryBusybox), "127.0.0.1:5000/mqlet/busybox:1"; got != want {
		t.Errorf("RegistryRef = %q, want %q", got, want)
	}
}

func TestLoadReportsWhatIsMissing(t *testing.T) {
	missingFile := filepath.Join(t.TempDir(), "no-such-env")
	_, err := load(func(string) string { return "" }, missingFile)
	if err == nil {
		t.Fatal("load with no environment and no file succeeded")
	}
	for _, want := range []string{VarContainerd, VarRegistry, VarImages, missingFile} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
}

func TestLoadRejectsMalformedFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "env")
	if err := os.WriteFile(file, []byte("MQLET_TEST_CONTAINERD\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := load(func(string) string { return "" }, file); err == nil || !strings.Contains(err.Error(), ":1:") {
		t.Fatalf("load of a line without '=' gave %v, want an error naming line 1", err)
	}
}

func TestNamespaceNameIsAValidUniqueIdentifier(t *testing.T) {
	for _, testName := range []string{
		"TestX",
		"TestPods/restart_policy=Never/#01",
		"Test__weird...Name--",
		strings.Repeat("VeryLongTestName", 20),
		"///",
	} {
		a, b := namespaceName(testName), namespaceName(testName)
		for _, n := range []string{a, b} {
			if err := identifiers.Validate(n); err != nil {
				t.Errorf("namespaceName(%q) = %q, not a valid containerd identifier: %v", testName, n, err)
			}
			if !strings.HasPrefix(n, "mqlet-test-") {
				t.Errorf("namespaceName(%q) = %q, want prefix mqlet-test-", testName, n)
			}
		}
		if a == b {
			t.Errorf("namespaceName(%q) returned %q twice", testName, a)
		}
	}
}

// TestContainerRuns proves the environment works end to end: import of a
// hand-built docker-archive, unpack onto overlayfs, and a runc container that
// runs to completion with its output captured.
func TestContainerRuns(t *testing.T) {
	env := Require(t)
	ns := Namespace(t, env.ContainerdAddress)
	ctx, cancel := context.WithTimeout(namespaces.WithNamespace(context.Background(), ns), 2*time.Minute)
	defer cancel()

	client, err := containerd.New(env.ContainerdAddress)
	if err != nil {
		t.Fatalf("connecting to containerd at %s: %v", env.ContainerdAddress, err)
	}
	defer client.Close()

	image := importImage(ctx, t, client, env.Image(Busybox), BusyboxRef)
	container, err := client.NewContainer(ctx, "echo-hi",
		containerd.WithImage(image),
		containerd.WithNewSnapshot("echo-hi-rootfs", image),
		containerd.WithNewSpec(oci.WithImageConfig(image), oci.WithProcessArgs("sh", "-c", "echo hi")),
	)
	if err != nil {
		t.Fatalf("creating container: %v", err)
	}

	// One buffer per stream: cio copies each stream in its own goroutine.
	var stdout, stderr bytes.Buffer
	task, err := container.NewTask(ctx, cio.NewCreator(cio.WithStreams(nil, &stdout, &stderr)))
	if err != nil {
		t.Fatalf("creating task: %v", err)
	}
	exitCh, err := task.Wait(ctx)
	if err != nil {
		t.Fatalf("waiting on task: %v", err)
	}
	if err := task.Start(ctx); err != nil {
		t.Fatalf("starting task: %v", err)
	}
	var status containerd.ExitStatus
	select {
	case status = <-exitCh:
	case <-ctx.Done():
		t.Fatalf("task did not exit: %v", ctx.Err())
	}
	code, _, err := status.Result()
	if err != nil {
		t.Fatalf("task exit status: %v", err)
	}
	// Delete waits for the output copy to finish, so the buffers are
	// complete (and no longer written) after it.
	if _, err := task.Delete(ctx); err != nil {
		t.Fatalf("deleting task: %v", err)
	}
	if code != 0 {
		t.Errorf("exit code = %d, want 0 (stderr %q)", code, stderr.String())
	}
	if got := stdout.String(); got != "hi\n" {
		t.Errorf("stdout = %q, want %q (stderr %q)", got, "hi\n", stderr.String())
	}
}

// TestNamespaceCleanupRemovesEverything leaves a running container, an image
// and snapshots behind in a subtest and checks that its namespace is gone
// once the subtest's cleanups have run.
func TestNamespaceCleanupRemovesEverything(t *testing.T) {
	env := Require(t)
	client, err := containerd.New(env.ContainerdAddress)
	if err != nil {
		t.Fatalf("connecting to containerd at %s: %v", env.ContainerdAddress, err)
	}
	defer client.Close()

	var ns string
	t.Run("leave-a-mess", func(t *testing.T) {
		ns = Namespace(t, env.ContainerdAddress)
		ctx, cancel := context.WithTimeout(namespaces.WithNamespace(context.Background(), ns), 2*time.Minute)
		defer cancel()
		image := importImage(ctx, t, client, env.Image(Busybox), BusyboxRef)
		container, err := client.NewContainer(ctx, "sleeper",
			containerd.WithImage(image),
			containerd.WithNewSnapshot("sleeper-rootfs", image),
			containerd.WithNewSpec(oci.WithImageConfig(image), oci.WithProcessArgs("sleep", "3600")),
		)
		if err != nil {
			t.Fatalf("creating container: %v", err)
		}
		task, err := container.NewTask(ctx, cio.NullIO)
		if err != nil {
			t.Fatalf("creating task: %v", err)
		}
		if err := task.Start(ctx); err != nil {
			t.Fatalf("starting task: %v", err)
		}
	})
	if ns == "" {
		t.Fatal("subtest did not create a namespace")
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	names, err := client.NamespaceService().List(ctx)
	if err != nil {
		t.Fatalf("listing namespaces: %v", err)
	}
	for _, n := range names {
		if n == ns {
			t.Fatalf("namespace %s still exists after cleanup", ns)
		}
	}
}

func importImage(ctx context.Context, t *testing.T, client *containerd.Client, archive, ref string) containerd.Image {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatalf("opening image archive: %v", err)
	}
	defer f.Close()
	imgs, err := client.Import(ctx, f)
	if err != nil {
		t.Fatalf("importing %s: %v", archive, err)
	}
	var found *images.Image
	for i := range imgs {
		if imgs[i].Name == ref {
			found = &imgs[i]
		}
	}
	if found == nil {
		t.Fatalf("importing %s gave images %v, want one named %s", archive, imgs, ref)
	}
	image := containerd.NewImage(client, *found)
	if err := image.Unpack(ctx, defaults.DefaultSnapshotter); err != nil {
		t.Fatalf("unpacking %s: %v", ref, err)
	}
	return image
}
