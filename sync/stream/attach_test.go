package stream

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"io"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/core/execio"
	"github.com/mqlet/mqlet/internal/testbuf"
	"github.com/mqlet/mqlet/sync/protocol"
	"github.com/mqlet/mqlet/sync/sealing"
)

// attachPod serves attaches: the container's output is "attached to <id>", the line its stdin
// brings is echoed, and it exits 3. Its ExecStream must not be reached by an attach.
type attachPod struct{ quietPod }

func (attachPod) ExecStream(ctx context.Context, id string, cmd []string, s execio.Streams) (int, error) {
	s.Stdout.Write([]byte("an exec, not an attach\n"))
	return 99, nil
}

func (attachPod) AttachStream(ctx context.Context, id string, s execio.Streams) (int, error) {
	s.Stdout.Write([]byte("attached to " + id + "\n"))
	if s.Stdin != nil {
		b, _ := io.ReadAll(s.Stdin)
		s.Stdout.Write([]byte("stdin:" + string(b)))
	}
	return 3, nil
}

func attachServer(t *testing.T, exec Execer) (*bus, ed25519.PrivateKey, *sealing.Key) {
	t.Helper()
	nk := make([]byte, 32)
	rand.Read(nk)
	key, _ := sealing.FromNodeKey(nk)
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	b := newBus()
	srv := NewServer(ServerOptions{Node: node, Topics: tp, Exec: exec, Pub: b, Key: key, Trusted: []ed25519.PublicKey{pub}})
	runServer(t, srv)
	b.Subscribe(context.Background(), tp.ExecRequest(node), srv.Handle)
	return b, priv, key
}

// An attach open reaches the Execer's AttachStream (not ExecStream) with the client's stdin, and
// brings back the container's output and exit code.
func TestAttachSessionReachesAttachStream(t *testing.T) {
	b, priv, key := attachServer(t, attachPod{})
	var out testbuf.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	code, err := Exec(ctx, b, tp, priv, node, key.PublicKey(), protocol.ExecRequest{Pod: "web", Attach: true},
		strings.NewReader("hello\n"), &out, nil, nil)
	if err != nil || code != 3 || out.String() != "attached to x\nstdin:hello\n" {
		t.Errorf("attach: code %d err %v output %q; want 3 and the attach's output with its stdin", code, err, out.String())
	}
}

// A node whose Execer cannot attach says so, sealed, and nothing runs.
func TestAttachSessionOnANodeThatCannotAttach(t *testing.T) {
	b, priv, key := attachServer(t, quietPod{})
	var out testbuf.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	code, err := Exec(ctx, b, tp, priv, node, key.PublicKey(), protocol.ExecRequest{Pod: "web", Attach: true}, nil, &out, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "this node cannot attach") || out.String() != "" {
		t.Errorf("attach on a node that cannot: code %d err %v output %q; want 'this node cannot attach' and no output", code, err, out.String())
	}
}
