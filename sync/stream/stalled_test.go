package stream

import (
	"context"
	"crypto/ecdh"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"net"
	"testing"
	"time"

	"github.com/mqlet/mqlet/core/execio"
	"github.com/mqlet/mqlet/sync/protocol"
	"github.com/mqlet/mqlet/sync/sealing"
)

// nopPub takes the node's frames and delivers none.
type nopPub struct{}

func (nopPub) Publish(ctx context.Context, topic string, payload []byte) error { return nil }

// chattyPod is a pod whose port-forward connection sends without end.
type chattyPod struct{}

func (chattyPod) ExecTarget(ns, name, c string) (string, error) { return "x", nil }
func (chattyPod) ExecStream(ctx context.Context, id string, cmd []string, s execio.Streams) (int, error) {
	<-ctx.Done()
	return -1, ctx.Err()
}
func (chattyPod) DialPod(ctx context.Context, ns, name string, port int) (net.Conn, error) {
	a, b := net.Pipe()
	go func() {
		buf := make([]byte, 32<<10)
		for {
			if _, err := b.Write(buf); err != nil {
				return
			}
		}
	}()
	return a, nil
}

// A port-forward whose client stopped granting credit while the pod still sends, then vanished,
// frees its slot when its lease runs out: the output writers wait for credit on the session's
// context, which the lease ends (found by review: they waited on the server's, for ever).
func TestStalledVanishedClientFreesItsSlot(t *testing.T) {
	nk := make([]byte, 32)
	rand.Read(nk)
	key, _ := sealing.FromNodeKey(nk)
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	srv := NewServer(ServerOptions{Node: node, Topics: tp, Exec: chattyPod{}, Pub: nopPub{}, Key: key,
		Trusted: []ed25519.PublicKey{pub}, Lease: 300 * time.Millisecond})
	runServer(t, srv) // a Handle before Run serves is dropped: a fixed sleep raced it under load
	eph, _ := ecdh.X25519().GenerateKey(rand.Reader)
	req := protocol.ExecRequest{APIVersion: protocol.APIVersion, ID: "exec-1", Op: protocol.ExecOpen, Namespace: "default", Pod: "web",
		Port: 80, ClientKey: base64.StdEncoding.EncodeToString(eph.PublicKey().Bytes()), NodeKeyID: sealing.KeyID(key.PublicKey()), Window: 64 << 10,
		Expires: time.Now().UTC().Add(time.Minute).Truncate(time.Second)}
	protocol.SignExecRequest(node, &req, priv)
	b, _ := protocol.Encode(&req)
	srv.Handle(b) // the client then vanishes: no lease, no credit
	// Before the fix the slot was never freed; how soon it is after the lease is not the point.
	waitUntil(t, "the vanished client's session frees its slot", func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return len(srv.sessions) == 0
	})
}
