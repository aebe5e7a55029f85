package ctrd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/mqlet/mqlet/core/logs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Kubelet's bounds on termination messages (pkg/kubelet/container): what a container wrote to its
// terminationMessagePath is read from the end, 4 KiB at most; the log's tail stands in for it with
// FallbackToLogsOnError, at most 80 lines and the last 2 KiB of them.
const (
	MaxTerminationMessage  = 4 << 10
	maxFallbackLogLines    = 80
	maxFallbackLogBytes    = 2 << 10
	fallbackLogCopyTimeout = 2 * time.Second // how long the log copy may take to finish after an exit
)

// terminationMessageFile is the host file attempt `restarts` of container name writes its
// termination message to: one per attempt, as kubelet makes one per container instance.
func (r *Runtime) terminationMessageFile(uid types.UID, name string, restarts int) (string, error) {
	dir, err := r.dirs().podDir(uid)
	if err != nil {
		return "", err
	}
	return joinUnder(dir, "containers", name, "termination-log."+strconv.Itoa(restarts))
}

// terminationMessageOpts makes attempt `restarts` its termination message file, empty and writable
// by any user as kubelet's is, and mounts it at the container's terminationMessagePath. The file of
// the attempt before the previous one goes: its message lives on only in lastState.
func (r *Runtime) terminationMessageOpts(pod *v1.Pod, c *v1.Container, restarts int) ([]oci.SpecOpts, error) {
	dest := c.TerminationMessagePath
	if dest == "" {
		return nil, nil
	}
	if !filepath.IsAbs(dest) {
		return nil, &StartError{"CreateContainerConfigError", fmt.Errorf("container %q: terminationMessagePath %q must be an absolute path", c.Name, dest)}
	}
	file, err := r.terminationMessageFile(pod.UID, c.Name, restarts)
	if err != nil {
		return nil, &StartError{"CreateContainerConfigError", fmt.Errorf("container %q: termination message file: %w", c.Name, err)}
	}
	if err := mkPrivateDir(filepath.Dir(file)); err != nil {
		return nil, &StartError{"CreateContainerError", fmt.Errorf("container %q: termination message file: %w", c.Name, err)}
	}
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW, 0o666)
	if err == nil {
		err = errors.Join(f.Chmod(0o666), f.Close()) // whatever the umask: the container may run as anyone
	}
	if err != nil {
		return nil, &StartError{"CreateContainerError", fmt.Errorf("container %q: termination message file: %w", c.Name, err)}
	}
	if restarts >= 2 {
		if old, err := r.terminationMessageFile(pod.UID, c.Name, restarts-2); err == nil {
			os.Remove(old)
		}
	}
	m := specs.Mount{Destination: dest, Type: "bind", Source: file, Options: []string{"rbind", "rw"}}
	return []oci.SpecOpts{oci.WithMounts([]specs.Mount{m})}, nil
}

// TerminationMessage is what the ended attempt c of container spec leaves in its status message,
// as kubelet reads it: the last MaxTerminationMessage bytes of its termination message file; with
// FallbackToLogsOnError, when that is empty and the container failed, the tail of its log (once the
// copy of its output ended, or after a short wait).
func (r *Runtime) TerminationMessage(c Container, spec *v1.Container) string {
	fallback := spec.TerminationMessagePolicy == v1.TerminationMessageFallbackToLogsOnError && c.ExitCode != 0
	msg, err := "", error(nil)
	if spec.TerminationMessagePath != "" {
		var file string
		if file, err = r.terminationMessageFile(types.UID(c.PodUID), c.Name, c.RestartCount); err == nil {
			msg, err = readTail(file, MaxTerminationMessage)
		}
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Sprintf("Error on reading termination log: %v", err)
	}
	if msg != "" || !fallback || c.LogPath == "" {
		return msg
	}
	r.waitLogs(c.ID, fallbackLogCopyTimeout)
	tail := &lastBytes{max: maxFallbackLogBytes}
	if err := logs.Read(context.Background(), c.LogPath, logs.ReadOptions{Tail: maxFallbackLogLines}, tail); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Sprintf("Error on reading termination message from logs: %v", err)
	}
	return string(tail.b)
}

// readTail reads at most limit bytes from the end of the file at path. The file is the container's
// to write: a symlink is not followed, and only its end is read however large it grew.
func readTail(path string, limit int64) (string, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file", path)
	}
	off := max(fi.Size()-limit, 0)
	b, err := io.ReadAll(io.NewSectionReader(f, off, limit))
	return string(b), err
}

// lastBytes keeps the last max bytes written to it.
type lastBytes struct {
	max int
	b   []byte
}

func (l *lastBytes) Write(p []byte) (int, error) {
	n := len(p)
	if len(p) >= l.max {
		l.b = append(l.b[:0], p[len(p)-l.max:]...)
		return n, nil
	}
	if over := len(l.b) + len(p) - l.max; over > 0 {
		l.b = append(l.b[:0], l.b[over:]...)
	}
	l.b = append(l.b, p...)
	return n, nil
}
