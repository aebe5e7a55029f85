package ctrd_test

import (
	"context"
	"testing"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/platforms"
	"github.com/mqlet/mqlet/internal/testenv"
)

// ListImages computes an image's size once per digest: after the first listing, the image's
// manifest is deleted from the content store (so its size can no longer be computed) and the
// next listing still reports the same size.
func TestListImagesRemembersSizes(t *testing.T) {
	rt, env, ns := newRuntime(t)
	ctx := context.Background()
	c, err := containerd.New(env.ContainerdAddress)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cctx := namespaces.WithNamespace(ctx, ns)
	img, err := c.ImageService().Get(cctx, testenv.BusyboxRef)
	if err != nil {
		t.Fatal(err)
	}
	want, err := img.Size(cctx, c.ContentStore(), platforms.Default())
	if err != nil || want <= 0 {
		t.Fatalf("size of %s through the content store: %d, %v", testenv.BusyboxRef, want, err)
	}
	size := func() int64 {
		t.Helper()
		list, err := rt.ListImages(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, i := range list {
			if i.Name == testenv.BusyboxRef {
				return i.Size
			}
		}
		t.Fatalf("%s not listed: %+v", testenv.BusyboxRef, list)
		return 0
	}
	if got := size(); got != want {
		t.Fatalf("first listing: size %d, want %d", got, want)
	}
	if err := c.ContentStore().Delete(cctx, img.Target.Digest); err != nil {
		t.Fatal(err)
	}
	if _, err := img.Size(cctx, c.ContentStore(), platforms.Default()); err == nil {
		t.Fatal("the size is still computable without the manifest; the test proves nothing")
	}
	if got := size(); got != want {
		t.Errorf("second listing: size %d, want the remembered %d", got, want)
	}
}
