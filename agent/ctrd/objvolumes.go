package ctrd

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/mqlet/mqlet/agent/atomicwriter"
	"github.com/mqlet/mqlet/agent/ctrspec"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
)

// Object volumes fail with a MountError (hostpath.go) wrapped in a ctrspec.ConfigError: a missing
// ConfigMap or Secret is the container's CreateContainerConfigError, as the issue asks.

// Volumes written from objects live below <pod dir>/volumes in a directory per kind, named as
// kubelet names its volume plugins. A volume name is a DNS label and holds no '~', so these never
// meet an emptyDir's <pod dir>/volumes/<name>.
const (
	volDirConfigMap   = "kubernetes.io~configmap"
	volDirSecret      = "kubernetes.io~secret"
	volDirDownwardAPI = "kubernetes.io~downward-api"
	volDirProjected   = "kubernetes.io~projected"
)

// objectVolumeDirs are the kinds' directories; those on tmpfs are unmounted at teardown.
var objectVolumeDirs = []struct {
	dir   string
	tmpfs bool
}{{volDirConfigMap, false}, {volDirSecret, true}, {volDirDownwardAPI, false}, {volDirProjected, true}}

// objectVolumeKind is the directory of v's kind and whether it lives on a tmpfs: secret volumes
// (and projected ones, which may carry secrets) never touch the disk, as with kubelet. ok is false
// for other volume kinds.
func objectVolumeKind(v *v1.Volume) (dir string, tmpfs, ok bool) {
	switch {
	case v.ConfigMap != nil:
		return volDirConfigMap, false, true
	case v.Secret != nil:
		return volDirSecret, true, true
	case v.DownwardAPI != nil:
		return volDirDownwardAPI, false, true
	case v.Projected != nil:
		return volDirProjected, true, true
	}
	return "", false, false
}

// setUpObjectVolume writes (or rewrites) v's files under podDir and returns the directory to bind
// into the container. handled is false when v is not a configMap, secret, downwardAPI or projected
// volume. Errors are *MountError inside a *ctrspec.ConfigError.
func (r *Runtime) setUpObjectVolume(pod *v1.Pod, podDir string, v *v1.Volume) (src string, handled bool, err error) {
	kindDir, tmpfs, ok := objectVolumeKind(v)
	if !ok {
		return "", false, nil
	}
	fail := func(err error) (string, bool, error) {
		return "", true, &ctrspec.ConfigError{Err: &MountError{Volume: v.Name, Err: err}}
	}
	dir, err := joinUnder(podDir, "volumes", kindDir, v.Name)
	if err != nil {
		return fail(err)
	}
	payload, err := r.volumePayload(pod, v)
	if err != nil {
		return fail(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fail(err)
	}
	if tmpfs {
		if err := ensureTmpfs(dir); err != nil {
			return fail(err)
		}
	}
	if _, err := atomicwriter.Write(dir, payload, writerOptions(pod)); err != nil {
		return fail(err)
	}
	return dir, true, nil
}

// writerOptions gives the files the pod's fsGroup, as kubelet does for these volumes.
func writerOptions(pod *v1.Pod) atomicwriter.Options {
	o := atomicwriter.Options{GID: -1}
	if sc := pod.Spec.SecurityContext; sc != nil && sc.FSGroup != nil {
		o.GID = int(*sc.FSGroup)
	}
	return o
}

// ensureTmpfs mounts a tmpfs at dir unless one is there: secret data is written only after.
func ensureTmpfs(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", dir, err)
	}
	if st.Type == tmpfsMagic {
		return nil
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755"); err != nil {
		return fmt.Errorf("mount tmpfs at %s (secret data is never written to disk): %w", dir, err)
	}
	return nil
}

// RefreshVolumes rewrites the pod's configMap, secret, downwardAPI and projected volumes that are
// set up already, so running containers see the objects' current content (pod.VolumeRefresher).
// The swap is atomic for readers. A volume whose object is gone (and not optional) keeps its last
// content, as kubelet's does; the error says why it was not updated.
func (r *Runtime) RefreshVolumes(_ context.Context, pod *v1.Pod) []error {
	podDir, err := r.dirs().podDir(pod.UID)
	if err != nil {
		return []error{err}
	}
	var errs []error
	for i := range pod.Spec.Volumes {
		v := &pod.Spec.Volumes[i]
		kindDir, tmpfs, ok := objectVolumeKind(v)
		if !ok {
			continue
		}
		dir, err := joinUnder(podDir, "volumes", kindDir, v.Name)
		if err != nil || !atomicwriter.IsSetUp(dir) {
			continue // set up when a container that mounts it starts
		}
		if tmpfs {
			// Never write secret data to a dir whose tmpfs went away underneath.
			if err := ensureTmpfs(dir); err != nil {
				errs = append(errs, &MountError{Volume: v.Name, Err: err})
				continue
			}
		}
		payload, err := r.volumePayload(pod, v)
		if err == nil {
			var changed bool
			if changed, err = atomicwriter.Write(dir, payload, writerOptions(pod)); changed && err == nil {
				r.log.Info("volume updated", "pod", pod.Namespace+"/"+pod.Name, "volume", v.Name)
			}
		}
		if err != nil {
			errs = append(errs, &MountError{Volume: v.Name, Err: err})
		}
	}
	return errs
}

// objectVolumesHook unmounts the tmpfs of the pod's secret and projected volumes before the pod
// dir is removed (it is after the pod dir hook, so its Destroy runs first). The volumes are written
// when a container that mounts them starts (setUpObjectVolume), not here: a missing ConfigMap is
// then the container's CreateContainerConfigError, retried, not a sandbox that cannot be made.
type objectVolumesHook struct{ dirs stateDir }

func (objectVolumesHook) Name() string { return "configMap/secret volumes" }

func (h objectVolumesHook) Destroy(_ context.Context, ref PodRef) error {
	dir, err := h.dirs.podDir(ref.UID)
	if err != nil {
		return err
	}
	var errs []error
	for _, k := range objectVolumeDirs {
		if !k.tmpfs {
			continue
		}
		names, err := dirNames(filepath.Join(dir, "volumes", k.dir))
		errs = append(errs, err)
		for _, n := range names {
			errs = append(errs, unmount(filepath.Join(dir, "volumes", k.dir, n)))
		}
	}
	return errors.Join(errs...)
}

// objectVolumeReadOnly: these volumes are mounted read-only whatever the mount says, as kubelet
// mounts them.
func objectVolumeReadOnly(v *v1.Volume) bool {
	_, _, ok := objectVolumeKind(v)
	return ok
}

// volumePayload computes the files of a configMap, secret, downwardAPI or projected volume.
func (r *Runtime) volumePayload(pod *v1.Pod, v *v1.Volume) (map[string]atomicwriter.File, error) {
	objs := ctrspec.ForPod(r.objectsOrNone(), pod)
	out := map[string]atomicwriter.File{}
	switch {
	case v.ConfigMap != nil:
		s := v.ConfigMap
		return out, configMapFiles(out, objs, pod.Namespace, s.Name, s.Items, s.Optional, s.DefaultMode, "configMap")
	case v.Secret != nil:
		s := v.Secret
		return out, secretFiles(out, objs, pod.Namespace, s.SecretName, s.Items, s.Optional, s.DefaultMode, "secret")
	case v.DownwardAPI != nil:
		return out, downwardFiles(out, r.downwardPod(pod), v.DownwardAPI.Items, v.DownwardAPI.DefaultMode, "downwardAPI")
	case v.Projected != nil:
		for i, p := range v.Projected.Sources {
			at := fmt.Sprintf("projected.sources[%d]", i)
			var err error
			switch {
			case p.ConfigMap != nil:
				err = configMapFiles(out, objs, pod.Namespace, p.ConfigMap.Name, p.ConfigMap.Items, p.ConfigMap.Optional, v.Projected.DefaultMode, at+".configMap")
			case p.Secret != nil:
				err = secretFiles(out, objs, pod.Namespace, p.Secret.Name, p.Secret.Items, p.Secret.Optional, v.Projected.DefaultMode, at+".secret")
			case p.DownwardAPI != nil:
				err = downwardFiles(out, r.downwardPod(pod), p.DownwardAPI.Items, v.Projected.DefaultMode, at+".downwardAPI")
			case p.ServiceAccountToken != nil:
				err = fmt.Errorf("%s.serviceAccountToken is not supported: mqlet has no Kubernetes API server to issue tokens", at)
			case p.ClusterTrustBundle != nil:
				err = fmt.Errorf("%s.clusterTrustBundle is not supported: mqlet has no Kubernetes API server to read them from", at)
			default:
				err = fmt.Errorf("%s names no source", at)
			}
			if err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("volume %q is not a configMap, secret, downwardAPI or projected volume", v.Name)
}

// defaultFileMode is kubelet's mode for these volumes' files when the pod sets none.
const defaultFileMode = 0o644

func itemMode(item, dflt *int32, at string) (os.FileMode, error) {
	m := int32(defaultFileMode)
	switch {
	case item != nil:
		m, at = *item, at+".mode"
	case dflt != nil:
		m, at = *dflt, "defaultMode"
	}
	if m < 0 || m > 0o777 {
		return 0, fmt.Errorf("%s %#o is not a file mode (0 to 0777)", at, m)
	}
	return os.FileMode(m), nil
}

func configMapFiles(out map[string]atomicwriter.File, objs ctrspec.Objects, ns, name string, items []v1.KeyToPath, optional *bool, dflt *int32, at string) error {
	cm, err := objs.ConfigMap(ns, name)
	found := err == nil
	if err != nil && !ctrspec.IsNotFound(err) {
		return err
	}
	data := map[string][]byte{}
	if found {
		for k, v := range cm.Data {
			data[k] = []byte(v)
		}
		for k, v := range cm.BinaryData {
			data[k] = v
		}
	}
	return keyFiles(out, "ConfigMap", ns, name, data, found, err, items, optional, dflt, at)
}

func secretFiles(out map[string]atomicwriter.File, objs ctrspec.Objects, ns, name string, items []v1.KeyToPath, optional *bool, dflt *int32, at string) error {
	s, err := objs.Secret(ns, name)
	found := err == nil
	if err != nil && !ctrspec.IsNotFound(err) {
		return err
	}
	data := map[string][]byte{}
	if found {
		for k, v := range s.Data {
			data[k] = v
		}
		for k, v := range s.StringData {
			data[k] = []byte(v)
		}
	}
	return keyFiles(out, "Secret", ns, name, data, found, err, items, optional, dflt, at)
}

// keyFiles adds the files of one ConfigMap or Secret: every key, or the items listed. A missing
// object or key is an error unless optional (a missing optional object gives no files). Messages
// name keys and paths, never values.
func keyFiles(out map[string]atomicwriter.File, kind, ns, name string, data map[string][]byte, found bool, notFound error,
	items []v1.KeyToPath, optional *bool, dflt *int32, at string) error {
	opt := optional != nil && *optional
	if !found {
		if opt {
			return nil
		}
		return notFound
	}
	if len(items) == 0 {
		mode, err := itemMode(nil, dflt, at)
		if err != nil {
			return err
		}
		for _, k := range slices.Sorted(maps.Keys(data)) {
			if err := atomicwriter.ValidatePath(k); err != nil {
				return fmt.Errorf("%s %s/%s: key %q cannot be a file name: %v", kind, ns, name, k, err)
			}
			out[k] = atomicwriter.File{Data: data[k], Mode: mode}
		}
		return nil
	}
	for i, it := range items {
		itemAt := fmt.Sprintf("%s.items[%d]", at, i)
		if err := atomicwriter.ValidatePath(it.Path); err != nil {
			return fmt.Errorf("%s.path %q: %v", itemAt, it.Path, err)
		}
		v, ok := data[it.Key]
		if !ok {
			if opt {
				continue
			}
			return fmt.Errorf("%s: key %s is not in %s %s/%s", itemAt, it.Key, kind, ns, name)
		}
		mode, err := itemMode(it.Mode, dflt, itemAt)
		if err != nil {
			return err
		}
		out[it.Path] = atomicwriter.File{Data: v, Mode: mode}
	}
	return nil
}

// downwardFiles adds a downwardAPI volume's items: pod metadata by fieldRef, a container's
// resources by resourceFieldRef.
func downwardFiles(out map[string]atomicwriter.File, pod *v1.Pod, items []v1.DownwardAPIVolumeFile, dflt *int32, at string) error {
	for i, it := range items {
		itemAt := fmt.Sprintf("%s.items[%d]", at, i)
		if err := atomicwriter.ValidatePath(it.Path); err != nil {
			return fmt.Errorf("%s.path %q: %v", itemAt, it.Path, err)
		}
		var val string
		var err error
		switch {
		case it.FieldRef != nil && it.ResourceFieldRef != nil:
			err = fmt.Errorf("%s: fieldRef and resourceFieldRef are both set", itemAt)
		case it.FieldRef != nil:
			val, err = volumePodField(pod, it.FieldRef.FieldPath)
		case it.ResourceFieldRef != nil:
			if it.ResourceFieldRef.ContainerName == "" {
				err = fmt.Errorf("%s.resourceFieldRef.containerName is required in a volume", itemAt)
			} else {
				val, err = ctrspec.ResourceFieldValue(pod, "", it.ResourceFieldRef)
			}
		default:
			err = fmt.Errorf("%s: neither fieldRef nor resourceFieldRef is set", itemAt)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", itemAt, err)
		}
		mode, err := itemMode(it.Mode, dflt, itemAt)
		if err != nil {
			return err
		}
		out[it.Path] = atomicwriter.File{Data: []byte(val), Mode: mode}
	}
	return nil
}

// volumePodField is what a downwardAPI volume may show: the pod's name, namespace and UID, its
// labels and annotations (whole, one "key=\"value\"" line each, sorted, as kubelet writes them),
// or one of them.
func volumePodField(pod *v1.Pod, path string) (string, error) {
	switch path {
	case "metadata.labels":
		return formatMap(pod.Labels), nil
	case "metadata.annotations":
		// The service variables the bridge sends with the pod are its transport, not an
		// annotation of the API's pod: hidden, as kubelet's pods have no such annotation.
		return formatMap(ctrspec.VisibleAnnotations(pod)), nil
	case "metadata.name", "metadata.namespace", "metadata.uid":
		return ctrspec.PodField(pod, path)
	}
	if strings.HasPrefix(path, "metadata.labels['") || strings.HasPrefix(path, "metadata.annotations['") {
		return ctrspec.PodField(pod, path)
	}
	return "", fmt.Errorf("fieldRef %q is not supported in a volume (metadata.name, metadata.namespace, metadata.uid, metadata.labels, metadata.annotations)", path)
}

func formatMap(m map[string]string) string {
	var b strings.Builder
	for i, k := range slices.Sorted(maps.Keys(m)) {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(k + "=" + strconv.Quote(m[k]))
	}
	return b.String()
}

// mountSubPath is the mount's subPath, or its subPathExpr with $(VAR) expanded from the
// container's env (kubelet's rule); openSubPath then keeps it inside the volume. A variable that is
// not defined, or defined empty, is an error (kubelet's ExpandContainerVolumeMounts: "missing value
// for"), rather than a literal "$(VAR)" directory or a path that silently names another place
// ("$(A)/x" would be "/x", "$(A)" the whole volume).
func mountSubPath(c *v1.Container, m v1.VolumeMount, env []v1.EnvVar) (string, error) {
	if m.SubPathExpr == "" {
		return m.SubPath, nil
	}
	if m.SubPath != "" {
		return "", ctrspec.ConfigErrorf("container %q volumeMount %q: subPath and subPathExpr are mutually exclusive", c.Name, m.Name)
	}
	vars := make(map[string]string, len(env))
	for _, e := range env {
		vars[e.Name] = e.Value
	}
	var missing []string
	out := ctrspec.ExpandFunc(m.SubPathExpr, func(name string) (string, bool) {
		if v := vars[name]; v != "" {
			return v, true
		}
		if !slices.Contains(missing, name) {
			missing = append(missing, name)
		}
		return "", false
	})
	if len(missing) > 0 {
		return "", ctrspec.ConfigErrorf("container %q volumeMount %q: subPathExpr %q: missing value for %s (not in the container's env, or empty)", c.Name, m.Name, m.SubPathExpr, strings.Join(missing, ", "))
	}
	return out, nil
}
