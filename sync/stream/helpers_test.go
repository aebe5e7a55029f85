package stream

// The package's own tests use in-memory parts (a bus for the broker, fake pods); the tests against a
// real mosquitto and containerd are in node/execstream_test.go (sync/ links no agent/).

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mqlet/mqlet/core/execio"
	"github.com/mqlet/mqlet/sync/protocol"
)

const (
	node        = "n1"
	testTimeout = 20 * time.Second
)

var tp = protocol.MustTopics(protocol.DefaultPrefix)

// bus is an in-memory broker: a publish reaches the handlers subscribed to its exact topic, in
// order, unless muted for that topic's prefix.
type bus struct {
	mu     sync.Mutex
	subs   map[string][]func([]byte)
	topics []string     // every topic published to, in order, delivered or not
	muted  atomic.Value // string prefix: publishes to topics under it are lost
}

// published counts the publishes so far to topics under prefix.
func (b *bus) published(prefix string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, t := range b.topics {
		if strings.HasPrefix(t, prefix) {
			n++
		}
	}
	return n
}

func newBus() *bus { return &bus{subs: map[string][]func([]byte){}} }

func (b *bus) Publish(ctx context.Context, topic string, payload []byte) error {
	b.mu.Lock()
	b.topics = append(b.topics, topic)
	b.mu.Unlock()
	if m, _ := b.muted.Load().(string); m != "" && strings.HasPrefix(topic, m) {
		return nil // taken, never delivered
	}
	b.mu.Lock()
	hs := slices.Clone(b.subs[topic])
	b.mu.Unlock()
	for _, h := range hs {
		h(append([]byte(nil), payload...))
	}
	return nil
}

func (b *bus) Subscribe(ctx context.Context, topic string, h func([]byte)) (func(), error) {
	b.mu.Lock()
	b.subs[topic] = append(b.subs[topic], h)
	n := len(b.subs[topic]) - 1
	b.mu.Unlock()
	return func() {
		b.mu.Lock()
		b.subs[topic][n] = func([]byte) {}
		b.mu.Unlock()
	}, nil
}

// quietPod runs every command as one that says "started" and then waits, writing nothing, until
// its session ends.
type quietPod struct{}

func (quietPod) ExecTarget(ns, name, c string) (string, error) { return "x", nil }
func (quietPod) ExecStream(ctx context.Context, id string, cmd []string, s execio.Streams) (int, error) {
	s.Stdout.Write([]byte("started\n"))
	<-ctx.Done()
	return -1, ctx.Err()
}

// runServer runs srv until the test ends and returns once it serves (a Handle before that is
// dropped, as the server is not running yet).
func runServer(t *testing.T, srv *Server) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	waitUntil(t, "the exec server serves", func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return srv.ctx != nil
	})
}

// waitUntil polls cond until it holds, failing the test after testTimeout.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(testTimeout); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, testTimeout)
		}
	}
}
