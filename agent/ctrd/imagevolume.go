package ctrd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
	"github.com/moby/sys/mountinfo"
	"github.com/opencontainers/image-spec/identity"
	v1 "k8s.io/api/core/v1"
)

// Image volumes (volumes[*].image, GA in Kubernetes 1.36): an OCI image's file system mounted into
// the pod's containers, read-only and non-executable, as the CRI mounts them.
//
// The image is pulled like a container's (the pod's pull secrets, its pullPolicy, an offline
// registry falling back to the local copy), and a read-only view of its unpacked layers (a
// containerd snapshot of its own, kept from containerd's garbage collection by its gc.root label)
// is mounted once per pod at <pod dir>/volumes/kubernetes.io~image/<name>; every container that
// mounts the volume gets a bind mount of it. The volume holds the image as it was when the pod
// first mounted it, for the pod's life (a restarted container sees the same files, even with
// pullPolicy Always); the view and its mount go with the pod (imageVolumesHook).

const (
	volDirImage = "kubernetes.io~image"
	// imageVolumeSnapshotPrefix starts the snapshot key of every image volume: the pod's UID and the
	// volume's name follow.
	imageVolumeSnapshotPrefix = "mqlet-imagevolume-"
	// LabelImageVolumeImage on an image volume's snapshot names its image, so image garbage
	// collection keeps it (ContainerImages).
	LabelImageVolumeImage = "mqlet.io/image-volume-image"
	labelGCRoot           = "containerd.io/gc.root"
)

// imageVolumeKey is the snapshot key of a pod's image volume. '_' cannot be in a volume name (a
// DNS label), so the last one splits the key back unambiguously whatever the UID holds.
func imageVolumeKey(uid, name string) string { return imageVolumeSnapshotPrefix + uid + "_" + name }

// setUpImageVolumes makes sure every image volume container c mounts is mounted below the pod's
// dir, and records each in sb.Volumes. A pull that fails is the container's ErrImagePull (or
// ErrImageNeverPull, InvalidImageName), as kubelet reports it.
func (r *Runtime) setUpImageVolumes(ctx context.Context, pod *v1.Pod, sb *Sandbox, c *v1.Container) error {
	mounted := map[string]bool{}
	for _, m := range c.VolumeMounts {
		mounted[m.Name] = true
	}
	for i := range pod.Spec.Volumes {
		v := &pod.Spec.Volumes[i]
		if v.Image == nil || !mounted[v.Name] {
			continue
		}
		dir, err := r.setUpImageVolume(ctx, pod, sb.Dir, v)
		if err != nil {
			return err
		}
		sb.Volumes[v.Name] = dir
	}
	return nil
}

func (r *Runtime) setUpImageVolume(ctx context.Context, pod *v1.Pod, podDir string, v *v1.Volume) (string, error) {
	dir, err := joinUnder(podDir, "volumes", volDirImage, v.Name)
	if err != nil {
		return "", &StartError{"CreateContainerConfigError", fmt.Errorf("image volume %q: %w", v.Name, err)}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", &StartError{"CreateContainerError", fmt.Errorf("image volume %q: %w", v.Name, err)}
	}
	// Not isMountPoint: with one layer the view is a bind mount, on the same device as the pod dir.
	if ok, err := mountinfo.Mounted(dir); err != nil {
		return "", &StartError{"CreateContainerError", fmt.Errorf("image volume %q: %w", v.Name, err)}
	} else if ok {
		return dir, nil // mounted by an earlier container of the pod (or before an agent restart)
	}
	// Admission defaulted the pull policy as the API does.
	img, err := r.EnsureImage(r.withPullSecrets(ctx, pod), v.Image.Reference, v.Image.PullPolicy)
	if err != nil {
		return "", pullFailure(fmt.Errorf("image volume %q: %w", v.Name, err))
	}
	ctx = r.ctx(ctx)
	diffIDs, err := img.RootFS(ctx)
	if err != nil {
		return "", &StartError{"CreateContainerError", fmt.Errorf("image volume %q: layers of %s: %w", v.Name, img.Name(), err)}
	}
	sn := r.client.SnapshotService(r.opts.Snapshotter)
	key := imageVolumeKey(string(pod.UID), v.Name)
	mounts, err := sn.View(ctx, key, identity.ChainID(diffIDs).String(), snapshots.WithLabels(map[string]string{
		labelGCRoot:           time.Now().UTC().Format(time.RFC3339),
		LabelImageVolumeImage: img.Name(),
		LabelPodUID:           string(pod.UID),
	}))
	if errdefs.IsAlreadyExists(err) {
		// Made before the agent stopped, not mounted yet (or unmounted by a reboot).
		mounts, err = sn.Mounts(ctx, key)
	}
	if err != nil {
		return "", &StartError{"CreateContainerError", fmt.Errorf("image volume %q: view of %s: %w", v.Name, img.Name(), err)}
	}
	if err := mount.All(mounts, dir); err != nil {
		return "", &StartError{"CreateContainerError", fmt.Errorf("image volume %q: mount %s: %w", v.Name, img.Name(), err)}
	}
	r.log.Info("image volume mounted", "pod", pod.Namespace+"/"+pod.Name, "volume", v.Name, "image", img.Name())
	return dir, nil
}

// unmountAll unmounts dir until nothing is mounted there (a bounded number of times: mounts may
// have been stacked by an earlier agent).
func unmountAll(dir string) error {
	for range 16 {
		ok, err := mountinfo.Mounted(dir)
		if err != nil || !ok {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		if err := unmount(dir); err != nil {
			return err
		}
	}
	return fmt.Errorf("unmount %s: still mounted after 16 unmounts", dir)
}

// imageVolumesHook unmounts the pod's image volumes and removes their snapshots before the pod
// dir goes (it comes after the pod dir hook, so its Destroy runs first).
type imageVolumesHook struct {
	dirs stateDir
	sn   func() snapshots.Snapshotter
	ctx  func(context.Context) context.Context
}

func (imageVolumesHook) Name() string { return "image volumes" }

func (h imageVolumesHook) Destroy(ctx context.Context, ref PodRef) error {
	dir, err := h.dirs.podDir(ref.UID)
	if err != nil {
		return err
	}
	root := filepath.Join(dir, "volumes", volDirImage)
	names, err := dirNames(root)
	errs := []error{err}
	for _, n := range names {
		errs = append(errs, unmountAll(filepath.Join(root, n)))
	}
	if err := errors.Join(errs...); err != nil {
		return err // a view still mounted must not lose its snapshot
	}
	if len(names) == 0 {
		// No image volume was ever set up: its dir is made before its snapshot, and goes only
		// with the pod dir, after this hook succeeded.
		return nil
	}
	ctx = h.ctx(ctx)
	sn := h.sn()
	var keys []string
	err = sn.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		// By the label, not a key prefix: a UID may be another's prefix.
		if strings.HasPrefix(info.Name, imageVolumeSnapshotPrefix) && info.Labels[LabelPodUID] == string(ref.UID) {
			keys = append(keys, info.Name)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("list the image volume snapshots of pod %s: %w", ref.UID, err)
	}
	for _, k := range keys {
		if err := sn.Remove(ctx, k); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("remove image volume snapshot %s: %w", k, err))
		}
	}
	return errors.Join(errs...)
}
