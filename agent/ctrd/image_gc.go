package ctrd

import (
	"context"
	"errors"
	"fmt"
	"strings"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// ImageUse is the image one container in the namespace was made from.
type ImageUse struct {
	Container string
	Name      string // the image name the container record carries
	Digest    string // the image's manifest digest when known (mqlet's containers record it); "" otherwise
}

// ContainerImages lists the image of every container in the namespace, mqlet's or anyone else's,
// running or not, and of every pod's image volume: image garbage collection keeps every image a
// container was made from or a pod mounts.
func (r *Runtime) ContainerImages(ctx context.Context) ([]ImageUse, error) {
	ctrs, err := r.client.ContainerService().List(r.ctx(ctx))
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	out := make([]ImageUse, 0, len(ctrs))
	for _, c := range ctrs {
		u := ImageUse{Container: c.ID, Name: c.Image}
		if _, d, ok := strings.Cut(c.Labels[LabelImageID], "@"); ok {
			u.Digest = d
		}
		out = append(out, u)
	}
	// An image a pod mounts as a volume is in use as much as a container's (imagevolume.go).
	err = r.client.SnapshotService(r.opts.Snapshotter).Walk(r.ctx(ctx), func(_ context.Context, info snapshots.Info) error {
		if img := info.Labels[LabelImageVolumeImage]; img != "" && strings.HasPrefix(info.Name, imageVolumeSnapshotPrefix) {
			out = append(out, ImageUse{Container: info.Name, Name: img})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list image volume snapshots: %w", err)
	}
	return out, nil
}

// RemoveImage deletes the image name and waits for containerd's garbage collection, so the blobs
// and unpacked layers nothing else holds are gone from disk when it returns. freed is what that
// took off the disk, reckoned just before the delete: the blobs only this image referenced (and no
// other containerd namespace holds, as namespaces share blob files) plus the unpacked layers no
// other image and no container is built on. An image that is already gone frees nothing and is no
// error; one that was re-pointed at other content meanwhile (a new pull of the tag) is kept.
func (r *Runtime) RemoveImage(ctx context.Context, name string) (freed int64, err error) {
	ctx = r.ctx(ctx)
	is := r.client.ImageService()
	img, err := is.Get(ctx, name)
	if errdefs.IsNotFound(err) {
		return 0, nil
	} else if err != nil {
		return 0, fmt.Errorf("remove image %s: %w", name, err)
	}
	all, err := is.List(ctx)
	if err != nil {
		return 0, fmt.Errorf("remove image %s: list images: %w", name, err)
	}
	freed, uerr := r.uniqueUsage(ctx, img, all)
	if uerr != nil {
		// The count is only a count: removing the image still frees what it frees.
		r.log.Warn("cannot tell how much removing an image frees; counting it as nothing", "image", name, "err", uerr)
		freed = 0
	}
	// The target check keeps a tag pulled anew meanwhile (daemons before 2.0 ignore it; the window
	// is the few milliseconds since the Get above).
	err = is.Delete(ctx, name, images.SynchronousDelete(), images.DeleteTarget(&img.Target))
	if errdefs.IsNotFound(err) {
		if now, gerr := is.Get(ctx, name); gerr == nil {
			return 0, fmt.Errorf("remove image %s: it changed to %s while being removed; kept", name, now.Target.Digest)
		}
		return 0, nil
	} else if err != nil {
		return 0, fmt.Errorf("remove image %s: %w", name, err)
	}
	r.log.Info("removed image", "image", name, "digest", img.Target.Digest, "freed", freed)
	return freed, nil
}

// uniqueUsage is the disk space only img holds: see RemoveImage.
func (r *Runtime) uniqueUsage(ctx context.Context, img images.Image, all []images.Image) (int64, error) {
	cs := r.client.ContentStore()
	mine, err := blobs(ctx, cs, img.Target)
	if err != nil {
		return 0, err
	}
	held := map[digest.Digest]bool{}
	var heldChains []digest.Digest // top chain ids of the other images
	for _, o := range all {
		if o.Name == img.Name {
			continue
		}
		if o.Target.Digest == img.Target.Digest {
			return 0, nil // another name for the same image: nothing goes
		}
		ob, err := blobs(ctx, cs, o.Target)
		if err != nil {
			return 0, fmt.Errorf("image %s: %w", o.Name, err)
		}
		for d := range ob {
			held[d] = true
		}
		if top := topChain(ctx, cs, o); top != "" {
			heldChains = append(heldChains, top)
		}
	}
	var freed int64
	var unique []digest.Digest
	for d, size := range mine {
		if !held[d] {
			unique = append(unique, d)
			freed += size
		}
	}
	shared, err := r.heldElsewhere(ctx, unique)
	if err != nil {
		return 0, err
	}
	freed -= shared

	layers, err := r.uniqueLayers(ctx, topChain(ctx, cs, img), heldChains)
	if err != nil {
		return 0, err
	}
	return freed + layers, nil
}

// blobs walks an image's content (index, manifests, config, layers) and returns the size of each
// blob present in the content store. Blobs the store never had (the manifests of other platforms)
// are skipped.
func blobs(ctx context.Context, cs content.Store, target ocispec.Descriptor) (map[digest.Digest]int64, error) {
	out := map[digest.Digest]int64{}
	err := images.Walk(ctx, images.HandlerFunc(func(ctx context.Context, desc ocispec.Descriptor) ([]ocispec.Descriptor, error) {
		if _, seen := out[desc.Digest]; seen {
			return nil, nil
		}
		info, err := cs.Info(ctx, desc.Digest)
		if errdefs.IsNotFound(err) {
			return nil, nil
		} else if err != nil {
			return nil, err
		}
		out[desc.Digest] = info.Size
		return images.Children(ctx, cs, desc)
	}), target)
	if err != nil {
		return nil, fmt.Errorf("walk content of %s: %w", target.Digest, err)
	}
	return out, nil
}

// heldElsewhere sums the sizes of the blobs that another containerd namespace also references:
// the blob file is shared, so deleting this namespace's reference frees nothing.
func (r *Runtime) heldElsewhere(ctx context.Context, ds []digest.Digest) (int64, error) {
	if len(ds) == 0 {
		return 0, nil
	}
	nss, err := r.client.NamespaceService().List(ctx)
	if err != nil {
		return 0, fmt.Errorf("list namespaces: %w", err)
	}
	cs := r.client.ContentStore()
	var shared int64
	for _, d := range ds {
		for _, ns := range nss {
			if ns == r.opts.Namespace {
				continue
			}
			info, err := cs.Info(namespaces.WithNamespace(ctx, ns), d)
			if err == nil {
				shared += info.Size
				break
			}
			if !errdefs.IsNotFound(err) {
				return 0, fmt.Errorf("content %s in namespace %s: %w", d, ns, err)
			}
		}
	}
	return shared, nil
}

// topChain is the chain id of an image's top layer for this platform, the name of the snapshot
// its unpack committed last; "" when it cannot be read (another platform's image, say).
func topChain(ctx context.Context, cs content.Store, img images.Image) digest.Digest {
	diffIDs, err := img.RootFS(ctx, cs, platforms.Default())
	if err != nil || len(diffIDs) == 0 {
		return ""
	}
	return identity.ChainID(diffIDs)
}

// uniqueLayers sums the usage of the unpacked layers (committed snapshots named by chain id) under
// top that no snapshot outside that chain is built on and no other image's chain includes: those go
// with the image. Container snapshots are built on their image's layers, so a layer a container
// uses is never counted.
func (r *Runtime) uniqueLayers(ctx context.Context, top digest.Digest, heldTops []digest.Digest) (int64, error) {
	if top == "" {
		return 0, nil
	}
	sn := r.client.SnapshotService(r.opts.Snapshotter)
	parent := map[string]string{}
	if err := sn.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		parent[info.Name] = info.Parent
		return nil
	}); err != nil {
		return 0, fmt.Errorf("walk snapshots: %w", err)
	}
	chain := map[string]bool{}
	for k := top.String(); k != ""; k = parent[k] {
		if _, ok := parent[k]; !ok {
			break // not unpacked, or the walk above it is not ours
		}
		chain[k] = true
	}
	held := map[string]bool{}
	hold := func(k string) {
		for ; k != "" && !held[k]; k = parent[k] {
			held[k] = true
		}
	}
	for name, p := range parent {
		if !chain[name] {
			hold(p)
		}
	}
	for _, t := range heldTops {
		hold(t.String())
	}
	var sum int64
	for k := range chain {
		if held[k] {
			continue
		}
		u, err := sn.Usage(ctx, k)
		if errdefs.IsNotFound(err) {
			continue
		} else if err != nil {
			return 0, fmt.Errorf("usage of snapshot %s: %w", k, err)
		}
		sum += u.Size
	}
	return sum, nil
}

// ErrContainerRunning refuses to remove a container whose task still runs.
var ErrContainerRunning = errors.New("container still runs")

// RemoveExitedContainer deletes a container whose task has ended (or that has none) with its
// snapshot, and returns the bytes its writable layer held. A container whose task runs, is paused
// or is being started is refused with ErrContainerRunning: garbage collection never stops anything.
// Its log file stays: it is the pod's "previous" log, and goes with the pod's log dir.
func (r *Runtime) RemoveExitedContainer(ctx context.Context, id string) (int64, error) {
	ctx = r.ctx(ctx)
	ctr, err := r.client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return 0, nil
	} else if err != nil {
		return 0, fmt.Errorf("remove container %s: %w", id, err)
	}
	if task, err := ctr.Task(ctx, nil); err == nil {
		st, err := task.Status(ctx)
		if err != nil {
			return 0, fmt.Errorf("remove container %s: task status: %w", id, err)
		}
		if st.Status != containerd.Stopped {
			return 0, fmt.Errorf("remove container %s: %w (%s)", id, ErrContainerRunning, st.Status)
		}
	} else if !errdefs.IsNotFound(err) {
		return 0, fmt.Errorf("remove container %s: load task: %w", id, err)
	}
	var size int64
	if info, err := ctr.Info(ctx); err == nil && info.SnapshotKey != "" {
		if u, err := r.client.SnapshotService(info.Snapshotter).Usage(ctx, info.SnapshotKey); err == nil {
			size = u.Size
		}
	}
	if err := r.removeByID(ctx, id); err != nil {
		return 0, err
	}
	return size, nil
}
