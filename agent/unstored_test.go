package agent

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/mqlet/mqlet/agent/manifest"
	"github.com/mqlet/mqlet/core/event"
	"github.com/mqlet/mqlet/store"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// fullStore is a store whose desired-pod writes fail while full is set, as a state dir with no
// space left makes them fail.
type fullStore struct {
	store.State
	mu       sync.Mutex
	full     bool
	failures int
}

func (s *fullStore) setFull(full bool) {
	s.mu.Lock()
	s.full = full
	s.mu.Unlock()
}

func (s *fullStore) UpdateDesired(put []store.DesiredPod, del []types.UID) error {
	s.mu.Lock()
	full := s.full
	if full {
		s.failures++
	}
	s.mu.Unlock()
	if full {
		return &os.PathError{Op: "write", Path: "/var/lib/mqlet/state.db", Err: syscall.ENOSPC}
	}
	return s.State.UpdateDesired(put, del)
}

func manifestPod(name string) string {
	return "apiVersion: v1\nkind: Pod\nmetadata: {name: " + name + "}\nspec:\n  containers:\n  - {name: c, image: busybox:1}\n"
}

// A change of the manifest dir made while the store cannot be written (the user removes the
// chatty pod that filled the disk, and adds another) is not lost: it is not acted on while it
// cannot be stored, /readyz and a node event say so, and it is stored and acted on as soon as
// the store takes writes again. Before, it was logged and dropped until the next change.
func TestSourceChangeRetriedUntilStored(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("spew.yaml", manifestPod("spew"))
	rt, st, rep := newFakeRuntime(), &fullStore{State: store.NewMemory()}, &fakeReporter{}
	a := startAgentWith(t, Options{Report: rep}, rt, st, manifest.NewDir(dir))
	waitPhase(t, a, "spew", v1.PodRunning, "")
	eventually(t, "agent ready", func() bool { return a.Ready() == nil })

	st.setFull(true)
	if err := os.Remove(filepath.Join(dir, "spew.yaml")); err != nil {
		t.Fatal(err)
	}
	write("quiet.yaml", manifestPod("quiet"))
	eventually(t, "readyz says the change is not stored", func() bool {
		err := a.Ready()
		return err != nil && strings.Contains(err.Error(), "not stored") && strings.Contains(err.Error(), "no space left on device")
	})
	if got := eventsWithReason(rep, event.ReasonStateWriteFailed); len(got) != 1 || got[0].Type != event.Warning ||
		got[0].Object.Kind != event.KindNode || !strings.Contains(got[0].Message, "no space left on device") {
		t.Errorf("StateWriteFailed events %+v, want one Warning about the node naming the cause", got)
	}
	// The source tries again (a second failed write) before the disk frees up.
	eventually(t, "the change retried", func() bool {
		st.mu.Lock()
		defer st.mu.Unlock()
		return st.failures >= 2
	})
	if names := a.podNames(); names != "default/spew" {
		t.Errorf("pods %q while the change is not stored, want default/spew alone (nothing acted on)", names)
	}

	st.setFull(false)
	waitPhase(t, a, "quiet", v1.PodRunning, "")
	eventually(t, "spew gone", func() bool { return podNamed(a, "spew") == nil })
	eventually(t, "agent ready again", func() bool { return a.Ready() == nil })
	if got := storedNames(t, st); got != "default/quiet" {
		t.Errorf("store holds %q, want default/quiet", got)
	}
	if got := eventsWithReason(rep, event.ReasonStateWriteRecovered); len(got) != 1 || got[0].Type != event.Normal {
		t.Errorf("StateWriteRecovered events %+v, want one Normal", got)
	}
	if got := eventsWithReason(rep, event.ReasonStateWriteFailed); len(got) != 1 {
		t.Errorf("%d StateWriteFailed events, want one for the whole episode (retries say nothing new)", len(got))
	}
}
