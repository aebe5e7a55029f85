package api

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

type fakeEvents map[types.UID][]v1.Event

func (f fakeEvents) Events(uid types.UID) []v1.Event { return f[uid] }

// The events route answers with the pod's events by UID (looked up by namespace and name), an
// empty list for a pod without events, and a not-found Status for an unknown pod.
func TestPodEvents(t *testing.T) {
	p := &fakeProvider{pods: []v1.Pod{pod("default", "web"), pod("default", "quiet")}}
	evs := fakeEvents{"uid-web": {{Reason: "BackOff", Count: 3, Message: "Back-off restarting failed container c"}}}
	sock := filepath.Join(shortDir(t), "mqlet.sock")
	srv := NewServer(p, nil)
	srv.HandleEvents(evs)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, sock) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	c := NewClient(sock)
	for {
		var ue *unreachableError
		if err := c.Ready(ctx); !errors.As(err, &ue) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}

	list, err := c.PodEvents(ctx, "default", "web")
	if err != nil {
		t.Fatal(err)
	}
	if list.Kind != "EventList" || len(list.Items) != 1 || list.Items[0].Reason != "BackOff" || list.Items[0].Count != 3 {
		t.Errorf("events of default/web = %+v", list)
	}
	if list, err := c.PodEvents(ctx, "default", "quiet"); err != nil || list.Items == nil || len(list.Items) != 0 {
		t.Errorf("events of a pod without any = %+v, %v; want an empty list", list, err)
	}
	if _, err := c.PodEvents(ctx, "other", "web"); !errors.Is(err, ErrNotFound) || err.Error() != "pod other/web not found" {
		t.Errorf("events of an unknown pod: %v", err)
	}
}
