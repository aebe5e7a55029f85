package stream

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"github.com/mqlet/mqlet/internal/testbuf"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/sync/protocol"
	"github.com/mqlet/mqlet/sync/sealing"
)

// A node that goes silent (its frames lost: an agent killed and restarted, a broker that lost
// them) is given up by the client once it has heard nothing, not even answers to its leases, for
// the silent limit: the caller gets an error instead of waiting for ever. While the node answers
// the leases, a command that writes nothing keeps its session; given up, the session's slot on the
// node is freed when its lease runs out.
func TestExecNodeGoesSilent(t *testing.T) {
	nk := make([]byte, 32)
	rand.Read(nk)
	key, _ := sealing.FromNodeKey(nk)
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	b := newBus()
	srv := NewServer(ServerOptions{Node: node, Topics: tp, Exec: quietPod{}, Pub: b, Key: key,
		Trusted: []ed25519.PublicKey{pub}, Lease: 2 * time.Second})
	runServer(t, srv)
	b.Subscribe(context.Background(), tp.ExecRequest(node), srv.Handle)

	var out testbuf.Buffer
	errc := make(chan error, 1)
	tm := timing{lease: 200 * time.Millisecond, silent: time.Second}
	go func() {
		_, err := execTimed(context.Background(), tm, b, tp, priv, node, key.PublicKey(),
			protocol.ExecRequest{Pod: "web", Command: []string{"sleep"}}, nil, &out, nil, nil)
		errc <- err
	}()
	waitUntil(t, "the command started", func() bool { return strings.Contains(out.String(), "started") })
	// Quiet but answering: five silent limits pass and the session holds, on the node's answers
	// to its leases (counted, so the wait shows them, not only the absence of an error).
	answers := b.published(tp.ExecReply(node, ""))
	select {
	case err := <-errc:
		t.Fatalf("the session of a quiet command that answers its leases ended: %v", err)
	case <-time.After(5 * tm.silent):
	}
	if n := b.published(tp.ExecReply(node, "")) - answers; n < 5 {
		t.Errorf("the node sent %d frames in five silent limits; want its answers to the leases (one each %s)", n, tm.lease)
	}
	b.muted.Store(tp.ExecReply(node, "")) // the node's frames are lost from now on
	select {
	case err := <-errc:
		if err == nil || !strings.Contains(err.Error(), "sent nothing") {
			t.Errorf("a silent node's session ended with %v, want the silence named", err)
		}
	case <-time.After(testTimeout):
		t.Fatal("the client still waits on a node that went silent")
	}
	// The node frees the session (its command ends) when the lease runs out or the cancel arrives.
	waitUntil(t, "the silent session frees its slot on the node", func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return len(srv.sessions) == 0
	})
}
