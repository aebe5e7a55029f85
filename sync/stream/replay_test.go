package stream

import (
	"bytes"
	"context"
	"crypto/ecdh"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mqlet/mqlet/sync/protocol"
	"github.com/mqlet/mqlet/sync/sealing"
)

// capPub keeps the node's frames instead of publishing them.
type capPub struct {
	mu  sync.Mutex
	got [][]byte
}

func (c *capPub) Publish(ctx context.Context, topic string, payload []byte) error {
	c.mu.Lock()
	c.got = append(c.got, payload)
	c.mu.Unlock()
	return nil
}

func (c *capPub) first(t *testing.T) *protocol.ExecSealed {
	t.Helper()
	waitUntil(t, "the node's first frame", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.got) > 0
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	f, err := protocol.DecodeExecSealed(c.got[0], 0)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// A captured open replayed to the node after its agent restarted (the served ids are kept in
// memory only) is refused when signed: it was issued before the agent started. One the node
// serves twice all the same (a node without trust anchors serves unsigned opens, and does not
// track them) gets other session keys each time, from the node's nonce: no keystream repeats and
// no recorded frame of the first session opens in the second (found by review: both sessions
// sealed frame 0 with the same key and nonce).
func TestReplayedOpenAfterRestart(t *testing.T) {
	nk := make([]byte, 32)
	rand.Read(nk)
	key, _ := sealing.FromNodeKey(nk)
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	eph, _ := ecdh.X25519().GenerateKey(rand.Reader)
	mkOpen := func(signed bool) []byte {
		now := time.Now().UTC().Truncate(time.Second)
		req := protocol.ExecRequest{APIVersion: protocol.APIVersion, ID: "exec-1", Op: protocol.ExecOpen, Namespace: "default", Pod: "web",
			Port: 80, ClientKey: base64.StdEncoding.EncodeToString(eph.PublicKey().Bytes()), NodeKeyID: sealing.KeyID(key.PublicKey()),
			Window: 64 << 10}
		if signed {
			req.Issued, req.Expires = now, now.Add(time.Minute)
			protocol.SignExecRequest(node, &req, priv)
		}
		b, _ := protocol.Encode(&req)
		return b
	}
	// serve runs a node's exec server (an agent start) whose clock is ahead by skew.
	serve := func(open func() []byte, trusted []ed25519.PublicKey, skew time.Duration) *protocol.ExecSealed {
		t.Helper()
		cp := &capPub{}
		srv := NewServer(ServerOptions{Node: node, Topics: tp, Exec: chattyPod{}, Pub: cp, Key: key, Trusted: trusted,
			Now: func() time.Time { return time.Now().Add(skew) }})
		runServer(t, srv)
		srv.Handle(open()) // made once the server runs: issued after it started
		return cp.first(t)
	}

	var signed []byte
	if f := serve(func() []byte { signed = mkOpen(true); return signed }, []ed25519.PublicKey{pub}, 0); f.Error != "" {
		t.Fatalf("the open, fresh: refused: %s", f.Error)
	}
	// The agent starts again, a second later by the node's clock.
	if f := serve(func() []byte { return signed }, []ed25519.PublicKey{pub}, time.Second); !strings.Contains(f.Error, "before this node's agent started") {
		t.Errorf("the signed open replayed after a restart: %+v, want it refused as issued before the start", f)
	}

	unsigned := mkOpen(false)
	replay := func() []byte { return unsigned }
	a, b := serve(replay, nil, 0), serve(replay, nil, 0)
	if a.Error != "" || b.Error != "" || len(a.Nonce) != protocol.ExecNonceSize || bytes.Equal(a.Nonce, b.Nonce) || bytes.Equal(a.Box, b.Box) {
		t.Errorf("the same unsigned open served twice: nonces %x / %x, frame 0 equal %v; want fresh nonces and other keys",
			a.Nonce, b.Nonce, bytes.Equal(a.Box, b.Box))
	}
}
