package e2e

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/agent/api"
	"github.com/mqlet/mqlet/internal/testenv"
	"github.com/mqlet/mqlet/store"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

const crashLoop = `apiVersion: v1
kind: Pod
metadata: {name: crash}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {name: main, image: mqlet.test/busybox:1, imagePullPolicy: IfNotPresent, command: ["sh", "-c", "exit 1"]}
`

// podEvents returns the pod's events from the agent's API.
func (h *harness) podEvents(name string) ([]v1.Event, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	list, err := h.client.PodEvents(ctx, "default", name)
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}

func eventOf(evs []v1.Event, reason string) *v1.Event {
	for i := range evs {
		if evs[i].Reason == reason {
			return &evs[i]
		}
	}
	return nil
}

// storedEvents opens the state file of a stopped agent and returns the events kept for uid.
func (h *harness) storedEvents(uid types.UID) (store.PodEvents, bool) {
	h.t.Helper()
	db, err := store.Open(filepath.Join(h.state, store.FileName))
	if err != nil {
		h.t.Fatal(err)
	}
	defer db.Close()
	p, ok, err := db.GetEvents(uid)
	if err != nil {
		h.t.Fatal(err)
	}
	return p, ok
}

// backOffRow matches the BackOff line of describe's Events table with a count: "(x3 over 25s)".
var backOffRow = regexp.MustCompile(`Warning\s+BackOff\s+\S+ \(x(\d+) over \S+\)\s+mqlet\s+Back-off restarting failed container main in pod crash_default\(`)

// A crash-looping container shows kubelet's events in `mqlet describe pod`, BackOff counted more
// than once; the events survive an agent restart (read back from the state file) and are gone,
// from the store too, once the pod is deleted.
func TestEventsCrashLoopE2E(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("crash.yaml", crashLoop)
	h.startAgent()

	// Crash 1 restarts at once, crash 2 waits 10 s (BackOff x1), crash 3 waits 20 s (x2).
	var desc string
	waitFor(t, "describe pod crash shows BackOff more than once", func() bool {
		desc = h.mqlet("describe", "pod", "crash")
		m := backOffRow.FindStringSubmatch(desc)
		n := 0
		if m != nil {
			n, _ = strconv.Atoi(m[1])
		}
		return n >= 2
	})
	t.Logf("mqlet describe pod crash:\n%s", desc)
	for _, want := range []string{"Events:", "Type", "Reason", "Age", "From", "Message",
		`Container image "mqlet.test/busybox:1" already present on machine`, "Created container: main", "Started container main"} {
		if !strings.Contains(desc, want) {
			t.Errorf("describe lacks %q:\n%s", want, desc)
		}
	}
	evs, err := h.podEvents("crash")
	if err != nil {
		t.Fatal(err)
	}
	started := eventOf(evs, "Started")
	if started == nil || started.Count < 3 || started.InvolvedObject.FieldPath != "spec.containers{main}" || started.Type != "Normal" {
		t.Errorf("Started event = %+v, want Normal, counted at least 3 times, about spec.containers{main}", started)
	}
	if b := eventOf(evs, "BackOff"); b == nil || !b.LastTimestamp.After(b.FirstTimestamp.Time) {
		t.Errorf("BackOff event %+v: want a last time after its first", b)
	}
	pod, err := h.getPod("crash")
	if err != nil {
		t.Fatal(err)
	}

	// Across a restart: the file holds them, and the restarted agent serves them.
	h.stopAgent()
	kept, ok := h.storedEvents(pod.UID)
	if !ok {
		t.Fatalf("no events stored for pod crash after the agent stopped\nagent log:\n%s", h.agentLog)
	}
	var storedBackOff int32
	for _, e := range kept.Events {
		if e.Reason == "BackOff" {
			storedBackOff = e.Count
		}
	}
	if storedBackOff < 2 {
		t.Errorf("stored BackOff count %d, want at least 2: %+v", storedBackOff, kept.Events)
	}
	h.startAgent()
	evs, err = h.podEvents("crash")
	if err != nil {
		t.Fatal(err)
	}
	if b := eventOf(evs, "BackOff"); b == nil || b.Count < storedBackOff {
		t.Errorf("after the restart BackOff = %+v, want the stored count %d or more", b, storedBackOff)
	}

	// Deleted: the API forgets the pod, and the store its events.
	if err := os.Remove(filepath.Join(h.manifests, "crash.yaml")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "pod crash gone", func() bool {
		_, err := h.getPod("crash")
		return errors.Is(err, api.ErrNotFound)
	})
	if _, err := h.podEvents("crash"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("events of a deleted pod: %v, want not found", err)
	}
	h.stopAgent()
	if p, ok := h.storedEvents(pod.UID); ok {
		t.Errorf("events of the deleted pod are still stored: %+v", p.Events)
	}
}

const deadlinePod = `apiVersion: v1
kind: Pod
metadata: {name: deadline}
spec:
  activeDeadlineSeconds: 3
  terminationGracePeriodSeconds: 1
  containers:
  - {name: main, image: mqlet.test/busybox:1, imagePullPolicy: IfNotPresent, command: ["sleep", "3600"]}
`

// activeDeadlineSeconds: 3 fails a sleeping pod with DeadlineExceeded, as kubelet does: phase
// Failed with the reason and message, its container stopped (containerd runs no task of it), and
// the event in describe.
func TestActiveDeadlineE2E(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("deadline.yaml", deadlinePod)
	h.startAgent()
	h.waitPod("deadline", "running", allRunning)
	p := h.waitPod("deadline", "Failed", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodFailed })
	if p.Status.Reason != "DeadlineExceeded" || p.Status.Message != "Pod was active on the node longer than the specified deadline" {
		t.Errorf("status reason %q message %q, want DeadlineExceeded and kubelet's message", p.Status.Reason, p.Status.Message)
	}
	cs := containerStatus(p, "main")
	if cs.State.Terminated == nil {
		t.Fatalf("container main = %+v, want terminated", cs.State)
	}
	if ran := cs.State.Terminated.FinishedAt.Sub(p.Status.StartTime.Time); ran < 3*time.Second {
		t.Errorf("pod failed %s after its start time, before its 3 s deadline", ran)
	}
	if tasks := h.tasks(); len(tasks) != 0 {
		t.Errorf("tasks still running in containerd after the deadline: %v", tasks)
	}
	desc := h.mqlet("describe", "pod", "deadline")
	for _, want := range []string{"DeadlineExceeded", "Pod was active on the node longer than the specified deadline", "Stopping container main"} {
		if !strings.Contains(desc, want) {
			t.Errorf("describe lacks %q:\n%s", want, desc)
		}
	}
	// It stays failed: nothing starts it again across a restart.
	h.stopAgent()
	h.startAgent()
	p = h.waitPod("deadline", "still Failed", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodFailed })
	if p.Status.Reason != "DeadlineExceeded" {
		t.Errorf("after a restart: reason %q", p.Status.Reason)
	}
	if tasks := h.tasks(); len(tasks) != 0 {
		t.Errorf("tasks running after a restart: %v", tasks)
	}
}

// A pull from a registry is reported as kubelet reports it: Pulling, then Pulled with how long it
// took and the image's size, then Created and Started.
func TestPullEventsE2E(t *testing.T) {
	h := newHarness(t)
	ref := h.env.RegistryRef(testenv.RegistryBusybox2)
	h.writeManifest("pulled.yaml", `apiVersion: v1
kind: Pod
metadata: {name: pulled}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {name: main, image: `+ref+`, command: ["sleep", "3600"]}
`)
	h.startAgent()
	h.waitPod("pulled", "running", allRunning)
	var evs []v1.Event
	waitFor(t, "Started event of pod pulled", func() bool {
		var err error
		evs, err = h.podEvents("pulled")
		return err == nil && eventOf(evs, "Started") != nil
	})
	order := []string{}
	for _, e := range evs {
		if e.Reason != "MissingClusterDNS" { // the sandbox's DNS warning (no clusterDNS here) is not a lifecycle step
			order = append(order, e.Reason)
		}
	}
	if strings.Join(order, ",") != "Pulling,Pulled,Created,Started" {
		t.Errorf("events in order %v, want Pulling, Pulled, Created, Started", order)
	}
	if e := eventOf(evs, "Pulling"); e == nil || e.Message != `Pulling image "`+ref+`"` {
		t.Errorf("Pulling event = %+v", e)
	}
	pulled := regexp.MustCompile(`^Successfully pulled image "` + regexp.QuoteMeta(ref) + `" in \S+ \(\S+ including waiting\)\. Image size: [1-9][0-9]* bytes\.$`)
	if e := eventOf(evs, "Pulled"); e == nil || !pulled.MatchString(e.Message) {
		t.Errorf("Pulled event = %+v", e)
	}
}
