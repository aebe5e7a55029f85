package ctrd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/mqlet/mqlet/agent/ctrd/beneath"
	"github.com/mqlet/mqlet/agent/ctrspec"
	"github.com/mqlet/mqlet/agent/qos"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"
)

// specOpts turns a Kubernetes container into OCI spec options, with kubelet's semantics for
// command/args, env expansion and resources. The stage the hostPath and subPath mounts come from
// (volumeMounts) is returned: runc copies its mounts when it creates the container, so the caller
// releases it once the task exists, or failed to.
func (r *Runtime) specOpts(pod *v1.Pod, sb *Sandbox, c *v1.Container, img containerd.Image, id string) (_ []oci.SpecOpts, stage *mountStage, err error) {
	defer func() {
		if err != nil {
			stage.Release()
		}
	}()
	// The env is read from the pod with the downward API's limit defaults; c stays the spec's
	// (its hash, its cgroup limits), found again by name in the defaulted pod only for
	// resourceFieldRef.
	env, skipped, err := ctrspec.ContainerEnvWith(r.downwardPod(pod), c, r.objectsOrNone())
	if err != nil {
		return nil, nil, err
	}
	if len(skipped) > 0 {
		r.log.Warn(ctrspec.SkippedMessage(c, skipped), "pod", pod.Namespace+"/"+pod.Name)
	}
	// Read once here for the command and the security options (the image's user).
	ic, err := img.Spec(context.Background())
	if err != nil {
		return nil, nil, fmt.Errorf("image config of %s: %w", img.Name(), err)
	}
	opts := []oci.SpecOpts{oci.WithImageConfig(img)}

	// Kubernetes: command replaces the image entrypoint, args replace its cmd; with only args the
	// entrypoint stays. $(VAR) in either is expanded from the container's env.
	if len(c.Command) > 0 || len(c.Args) > 0 {
		args := ctrspec.ExpandAll(c.Command, env)
		if len(c.Command) == 0 {
			args = append([]string(nil), ic.Config.Entrypoint...)
		}
		if len(c.Args) > 0 {
			args = append(args, ctrspec.ExpandAll(c.Args, env)...)
		} else if len(c.Command) == 0 {
			args = append(args, ic.Config.Cmd...)
		}
		if len(args) == 0 {
			return nil, nil, ctrspec.ConfigErrorf("container %q: no command: the image has no entrypoint or cmd and the pod gives none", c.Name)
		}
		opts = append(opts, oci.WithProcessArgs(args...))
	}
	if len(env) > 0 {
		kv := make([]string, len(env))
		for i, e := range env {
			kv[i] = e.Name + "=" + e.Value
		}
		opts = append(opts, oci.WithEnv(kv))
	}
	if c.WorkingDir != "" {
		opts = append(opts, oci.WithProcessCwd(c.WorkingDir))
	}

	nsOpts, err := ctrspec.NamespaceOpts(pod, sb.namespaces())
	if err != nil {
		return nil, nil, err
	}
	opts = append(opts, nsOpts...)
	// Before securityOpts: a privileged container's oci.WithPrivileged makes the mount read-write.
	opts = append(opts, ctrspec.CgroupFSOpts(c, ctrspec.Privileged(pod, c), r.cg)...)
	files, err := podFileMounts(pod, sb, c) // hosts, resolv.conf, hostname (dns.go)
	if err != nil {
		return nil, nil, err
	}
	opts = append(opts, files)

	mounts, stage, err := r.volumeMounts(pod, sb, c, env, id)
	if err != nil {
		return nil, nil, err
	}
	if len(mounts) > 0 {
		opts = append(opts, oci.WithMounts(mounts))
	}
	opts = append(opts, ctrspec.ResourceOpts(c, r.cg)...)
	opts = append(opts, ctrspec.WithOOMScoreAdj(r.oomScoreAdj(pod, c)))
	secOpts, err := r.securityOpts(pod, c, ic.Config.User)
	if err != nil {
		return nil, nil, err
	}
	opts = append(opts, secOpts...)
	opts = append(opts, oci.WithCgroup(filepath.Join(sb.CgroupParent, id)))
	return opts, stage, nil
}

// volumeMounts supports emptyDir (made by the sandbox), hostPath, and configMap, secret,
// downwardAPI and projected volumes (written when the container starts, objvolumes.go); other
// volume kinds are refused clearly rather than silently skipped. env expands subPathExpr.
//
// A hostPath, and a subPath of any volume, is opened here beneath its root (openHostPath,
// openSubPath) and mounted from the open file, not from its path, through container id's mount
// stage (mountstage.go): nothing a container renames or links afterwards changes what is mounted.
// The caller releases the stage once runc has created the container (NewTask).
func (r *Runtime) volumeMounts(pod *v1.Pod, sb *Sandbox, c *v1.Container, env []v1.EnvVar, id string) (_ []specs.Mount, stage *mountStage, err error) {
	vols := map[string]v1.Volume{}
	for _, v := range pod.Spec.Volumes {
		vols[v.Name] = v
	}
	var out []specs.Mount
	defer func() {
		if err != nil {
			stage.Release()
		}
	}()
	for _, m := range c.VolumeMounts {
		v, ok := vols[m.Name]
		if !ok {
			return nil, nil, ctrspec.ConfigErrorf("container %q: volumeMount %q names no volume of the pod", c.Name, m.Name)
		}
		var src string    // a directory the agent made and owns: mounted by its path
		var file *os.File // or a file opened beneath its root: mounted from the open file
		switch {
		case v.EmptyDir != nil:
			if src = sb.Volumes[v.Name]; src == "" {
				return nil, nil, fmt.Errorf("emptyDir %q: not set up by the pod's sandbox", v.Name)
			}
		case v.HostPath != nil:
			if file, err = openHostPath(pod, v); err != nil { // hostpath.go
				return nil, nil, err
			}
		case v.Image != nil:
			if src = sb.Volumes[v.Name]; src == "" { // imagevolume.go
				return nil, nil, fmt.Errorf("image volume %q: not set up for container %q", v.Name, c.Name)
			}
		default:
			var handled bool
			if src, handled, err = r.setUpObjectVolume(pod, sb.Dir, &v); err != nil {
				return nil, nil, err
			} else if !handled {
				return nil, nil, ctrspec.ConfigErrorf("volume %q: only emptyDir, hostPath, configMap, secret, downwardAPI, projected and image volumes are supported", v.Name)
			}
		}
		// A missing subPath is made a directory in any kind of volume, as kubelet's makeMounts does
		// (SafeMakeDir, before it checks the kind): in a configMap, secret, downwardAPI or projected
		// volume too, where it stays an empty directory the writer leaves alone (it removes only its
		// own links), mounted read-only like the rest of that volume.
		if src, err = r.stageMount(&stage, id, c, m, env, src, file); err != nil {
			return nil, nil, err
		}
		opts := []string{"rbind", "rw"}
		switch {
		case v.Image != nil:
			// As the CRI mounts them: nothing in an image volume runs or gains privileges.
			opts = []string{"rbind", "ro", "nosuid", "nodev", "noexec"}
		case m.ReadOnly || objectVolumeReadOnly(&v):
			opts[1] = "ro"
		}
		out = append(out, specs.Mount{Destination: m.MountPath, Type: "bind", Source: src, Options: opts})
	}
	return out, stage, nil
}

// stageMount returns the source of mount m of a volume that is the directory src or the open file
// (which it closes): the volume's subPath opened beneath it, if m has one, and anything open staged
// in *stage (made at first use).
func (r *Runtime) stageMount(stage **mountStage, id string, c *v1.Container, m v1.VolumeMount, env []v1.EnvVar, src string, file *os.File) (string, error) {
	if file != nil {
		defer func() { file.Close() }()
	}
	subPath, err := mountSubPath(c, m, env)
	if err != nil {
		return "", err
	}
	if subPath != "" {
		sub, err := openSubPath(src, file, subPath)
		if err != nil {
			return "", ctrspec.ConfigErrorf("container %q volumeMount %q: subPath %q: %v", c.Name, m.Name, subPath, err)
		}
		if file != nil {
			file.Close()
		}
		file = sub
	}
	if file == nil {
		return src, nil
	}
	if *stage == nil {
		if *stage, err = r.newMountStage(id); err != nil {
			return "", &StartError{"CreateContainerError", fmt.Errorf("container %q volumeMount %q: %w", c.Name, m.Name, err)}
		}
	}
	staged, err := (*stage).add(file)
	if err != nil {
		return "", &StartError{"CreateContainerError", fmt.Errorf("container %q volumeMount %q: %w", c.Name, m.Name, err)}
	}
	return staged, nil
}

// openSubPath opens subPath beneath the volume's root (the directory dir, or the open file root of a
// hostPath volume) and returns it: a subPath that leads out of the volume, through a symlink planted
// by a container writing to it (kubelet's CVE-2017-1002101) or one swapped in while it is opened, is
// refused; one staying inside works. What is missing is made a directory (parents too), relative to
// the descriptors of its parents, with the volume root's permissions, as kubelet makes subPaths
// (doSafeMakeDir): never through a symlink, so nothing is made outside the volume.
func openSubPath(dir string, root *os.File, subPath string) (*os.File, error) {
	if filepath.IsAbs(subPath) || slices.Contains(strings.Split(filepath.ToSlash(subPath), "/"), "..") {
		return nil, fmt.Errorf("must be a relative path without '..'")
	}
	if root == nil {
		var err error
		if root, err = beneath.OpenDir(dir); err != nil {
			return nil, fmt.Errorf("volume root: %w", err)
		}
		defer root.Close()
	}
	fi, err := root.Stat()
	if err != nil {
		return nil, fmt.Errorf("volume root %s: %w", root.Name(), err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("the volume %s is not a directory", root.Name())
	}
	f, err := beneath.Open(root, subPath, beneath.Options{Create: beneath.CreateDirs, Perm: fi.Mode().Perm()})
	var esc *beneath.EscapeError
	if errors.As(err, &esc) {
		return nil, fmt.Errorf("leads out of the volume: %w", err)
	}
	return f, err
}

// oomScoreAdj is kubelet's score for the container's QoS class, raised to the floor this machine
// allows (see oomScoreFloor) with a warning, never failing the pod for it.
func (r *Runtime) oomScoreAdj(pod *v1.Pod, c *v1.Container) int {
	class := qos.Class(&pod.Spec)
	adj := qos.OOMScoreAdj(class, c, r.memCapacity)
	if adj < r.oomFloor {
		r.oomWarned.Do(func() {
			r.log.Warn("oom_score_adj raised to what this node allows: mqlet has no CAP_SYS_RESOURCE, so containers cannot score below containerd's shim (the same clamp as containerd's restrict_oom_score_adj)",
				"pod", pod.Namespace+"/"+pod.Name, "container", c.Name, "qos", class, "wanted", adj, "applied", r.oomFloor)
		})
		adj = r.oomFloor
	}
	return adj
}

// securityOpts applies the pod's and the container's security context the way kubelet and
// containerd's CRI plugin together do. Refusals that depend on the image (runAsNonRoot with an
// image that runs as root) are ConfigErrors: kubelet's CreateContainerConfigError. imageUser is
// the image config's User.
func (r *Runtime) securityOpts(pod *v1.Pod, c *v1.Container, imageUser string) ([]oci.SpecOpts, error) {
	return ctrspec.SecurityOpts(pod, c, ctrspec.SecurityInputs{ImageUser: imageUser, SeccompRoot: filepath.Join(r.opts.StateDir, ctrspec.SeccompDir)})
}
