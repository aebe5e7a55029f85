package manifest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/mqlet/mqlet/core/source"
)

// watcher runs Dir.Watch in the background and records the snapshots it delivers.
type watcher struct {
	mu    sync.Mutex
	snaps []Snapshot
	done  chan error
	// refuse is how many more snapshots the consumer refuses to take, as the agent does when
	// its store write fails; refused snapshots are recorded in refused, not snaps.
	refuse  int
	refused []Snapshot
}

func startWatch(t *testing.T, d *Dir, resync time.Duration) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{done: make(chan error, 1)}
	go func() {
		w.done <- d.Watch(ctx, resync, func(s Snapshot) bool {
			w.mu.Lock()
			defer w.mu.Unlock()
			if w.refuse > 0 {
				w.refuse--
				w.refused = append(w.refused, s)
				return false
			}
			w.snaps = append(w.snaps, s)
			return true
		})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-w.done:
			if err != nil {
				t.Errorf("Watch returned %v after cancel, want nil", err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("Watch did not return within 5s of cancel")
		}
	})
	return w
}

// waitFor waits until the latest delivered snapshot's pods read want (see podNames).
func (w *watcher) waitFor(t *testing.T, what, want string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	last := "<no snapshot>"
	for time.Now().Before(deadline) {
		w.mu.Lock()
		if n := len(w.snaps); n > 0 {
			last = podNames(w.snaps[n-1])
		}
		w.mu.Unlock()
		if last == want {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s: pods %q after 5s, want %q", what, last, want)
}

func (w *watcher) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.snaps)
}

func TestWatchSeesChanges(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "web.yaml")
	writeFile(t, filepath.Join(dir, "first.yaml"), podYAML("first", "img:0"))
	w := startWatch(t, NewDir(dir), time.Hour)
	w.waitFor(t, "initial scan", "first=img:0")

	writeFile(t, file, podYAML("web", "img:1"))
	w.waitFor(t, "create", "first=img:0 web=img:1")

	// In place, the way `echo > file` does it: truncate then write.
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(podYAML("web", "img:2")); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	w.waitFor(t, "modify in place", "first=img:0 web=img:2")

	// The way editors and config management save: write a temp file, rename it over.
	tmp := filepath.Join(dir, ".web.yaml.tmp")
	writeFile(t, tmp, podYAML("web", "img:3"))
	if err := os.Rename(tmp, file); err != nil {
		t.Fatal(err)
	}
	w.waitFor(t, "rename over", "first=img:0 web=img:3")

	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	w.waitFor(t, "delete", "first=img:0")

	// Moving a file out of the directory removes its pods too.
	if err := os.Rename(filepath.Join(dir, "first.yaml"), filepath.Join(t.TempDir(), "first.yaml")); err != nil {
		t.Fatal(err)
	}
	w.waitFor(t, "move out", "")
}

func TestWatchSkipsUnchangedSnapshots(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.yaml"), podYAML("a", "img"))
	// A fast resync rescans many times while the test runs; none of those may be delivered.
	w := startWatch(t, NewDir(dir), 5*time.Millisecond)
	w.waitFor(t, "initial scan", "a=img")
	// Noise that does not change any pod: editor swap files, rewriting the same content.
	writeFile(t, filepath.Join(dir, ".a.yaml.swp"), "swap")
	writeFile(t, filepath.Join(dir, "a.yaml.tmp"), podYAML("a", "img"))
	if err := os.Rename(filepath.Join(dir, "a.yaml.tmp"), filepath.Join(dir, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "a.yaml"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A real change afterwards proves the noise was seen and processed before it.
	writeFile(t, filepath.Join(dir, "b.yaml"), podYAML("b", "img"))
	w.waitFor(t, "create b", "a=img b=img")
	if n := w.count(); n != 2 {
		t.Errorf("got %d snapshots, want 2 (initial, then b): unchanged snapshots were delivered again", n)
	}
}

func TestWatchDirectoryAppearsAndDisappears(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "pods")
	w := startWatch(t, NewDir(dir), time.Hour)

	// Let the initial (empty) snapshot arrive so the directory is created after Watch began.
	deadline := time.Now().Add(5 * time.Second)
	for w.count() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if w.count() == 0 {
		t.Fatal("no initial snapshot within 5s for a missing directory")
	}

	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "a.yaml"), podYAML("a", "img"))
	w.waitFor(t, "directory created", "a=img")

	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	w.waitFor(t, "directory removed", "")

	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "b.yaml"), podYAML("b", "img"))
	w.waitFor(t, "directory recreated", "b=img")
}

func TestWatchMissingParent(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "etc", "mqlet", "pods")
	w := startWatch(t, NewDir(dir), time.Hour)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "a.yaml"), podYAML("a", "img"))
	// Neither the directory nor its parent existed: found by polling.
	w.waitFor(t, "directory and parent created", "a=img")
}

// A snapshot the consumer could not take (the agent's store write failed) is delivered again,
// with no further change in the directory, until it is taken: the change is not lost. Before,
// it waited for the next change of the directory, which for a removed file may never come.
func TestWatchRetriesUntilTaken(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.yaml"), podYAML("a", "img:1"))
	w := startWatch(t, NewDir(dir), 0)
	w.waitFor(t, "initial scan", "a=img:1")
	w.mu.Lock()
	w.refuse = 2
	w.mu.Unlock()
	if err := os.Remove(filepath.Join(dir, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	w.waitFor(t, "the removal, taken after two refusals", "")
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.refused) != 2 || podNames(w.refused[0]) != "" || podNames(w.refused[1]) != "" {
		t.Errorf("refused deliveries %d, want 2 of the removal", len(w.refused))
	}
}

// Run delivers the directory again when its ConfigMaps and Secrets could not be stored, even if the
// pods were: a ConfigMap written while the disk was full is stored once it has room.
func TestRunRetriesObjectsNotStored(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.yaml"), podYAML("a", "img:1"))
	d := NewDir(dir)
	var mu sync.Mutex
	calls := 0
	d.OnObjects(func(Snapshot) error {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls == 1 {
			return errors.New("store: no space left on device")
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- d.Run(ctx, func(source.Change) source.Result { return source.Result{} })
	}()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := calls
		mu.Unlock()
		if n >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("objects handed over %d times in 5s, want a second time after the failed store", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
