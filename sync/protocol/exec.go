package protocol

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Ops of the messages on a node's exec/req topic.
const (
	ExecOpen  = "open"  // an ExecRequest: start a session
	ExecFrame = "frame" // an ExecSealed: one of the session's sealed frames
)

// TermSize is a terminal's size in character cells.
type TermSize struct {
	Width  uint16 `json:"width"`
	Height uint16 `json:"height"`
}

// ExecRequest opens an exec session in a pod's container (docs/protocol.md §9a). It is signed like
// a LogsRequest (SignExecRequest), including ClientKey, so nobody but the signer can take part in
// the session: the session's keys come from ClientKey and the node's sealing key.
type ExecRequest struct {
	APIVersion string   `json:"apiVersion"`
	ID         string   `json:"id"`
	Op         string   `json:"op"`
	Namespace  string   `json:"namespace"`
	Pod        string   `json:"pod"`
	Container  string   `json:"container,omitempty"`
	Command    []string `json:"command,omitempty"`
	// Port, instead of Command, makes the session a port-forward: the node connects to this
	// port on the pod's 127.0.0.1 and the session's stdin and stdout are the connection's bytes.
	Port int32 `json:"port,omitempty"`
	// Attach, instead of Command or Port, joins the container's own process (kubectl attach): its
	// output from now on, its stdin if the container has one, its terminal's size.
	Attach bool      `json:"attach,omitempty"`
	Stdin  bool      `json:"stdin,omitempty"`
	TTY    bool      `json:"tty,omitempty"`
	Size   *TermSize `json:"size,omitempty"`
	// ClientKey is the client's ephemeral X25519 public key (base64); NodeKeyID the id
	// (sealing.KeyID) of the node sealing key the client agreed with.
	ClientKey string `json:"clientKey"`
	NodeKeyID string `json:"nodeKeyID"`
	// Window is how many bytes of output the node may send before the client grants more.
	Window  int64     `json:"window"`
	Expires time.Time `json:"expires,omitzero"`
	// Issued is when a signed open was made: a node refuses one issued before it started, whose
	// id it cannot know to be new (the served ids are kept in memory only).
	Issued    time.Time  `json:"issued,omitzero"`
	Signature *Signature `json:"signature,omitempty"`
}

// ExecSealed is one frame of a session, either way: Box is the frame sealed with the direction's
// session key, with Seq (0, 1, 2... per direction) as its nonce. Error, with no Box, is the node's
// refusal of an open it could not start a session for (in clear: no key is agreed yet).
type ExecSealed struct {
	APIVersion string `json:"apiVersion"`
	ID         string `json:"id"`
	Op         string `json:"op"`
	Seq        uint64 `json:"seq"`
	// Nonce is the node's part of the session keys (ExecNonceSize random bytes), in clear on its
	// first frame: a replayed open gets other keys, so no keystream repeats and recorded frames
	// never open again.
	Nonce []byte `json:"nonce,omitempty"`
	Box   []byte `json:"box,omitempty"`
	Error string `json:"error,omitempty"`
}

// ExecNonceSize is the size of ExecSealed.Nonce.
const ExecNonceSize = 32

func (x *ExecRequest) apiVersion() *string { return &x.APIVersion }
func (x *ExecSealed) apiVersion() *string  { return &x.APIVersion }

// MaxExecBox bounds a sealed frame: 32 KiB of data plus the frame's and the AEAD's overhead.
const MaxExecBox = 32<<10 + 64

// ExecOp reads the op and id of a message on exec/req, to pick its decoder.
func ExecOp(payload []byte) (op, id string) {
	var peek struct {
		Op string `json:"op"`
		ID string `json:"id"`
	}
	if json.Unmarshal(payload, &peek) != nil {
		return "", ""
	}
	return peek.Op, peek.ID
}

// DecodeExecRequest decodes and validates an exec open.
func DecodeExecRequest(payload []byte, max int) (*ExecRequest, error) {
	x, err := decodePayload[ExecRequest](payload, max, "exec request")
	if err != nil {
		return nil, err
	}
	if err := ValidateRequestID(x.ID); err != nil {
		return nil, fmt.Errorf("exec request: %w", err)
	}
	if x.Op != ExecOpen {
		return nil, fmt.Errorf("exec request %s: op %q, want open", x.ID, x.Op)
	}
	if x.Signature != nil {
		if err := validSignatureShape(x.Signature); err != nil {
			return nil, fmt.Errorf("exec request %s: %w", x.ID, err)
		}
	}
	if err := ValidateObjectName(KindPod, x.Namespace, x.Pod); err != nil {
		return nil, fmt.Errorf("exec request %s: %w", x.ID, err)
	}
	if x.Container != "" {
		if errs := validation.IsDNS1123Label(x.Container); len(errs) > 0 {
			return nil, fmt.Errorf("exec request %s: container name %q is invalid: %s", x.ID, x.Container, strings.Join(errs, "; "))
		}
	}
	switch {
	case x.Attach && (x.Port != 0 || len(x.Command) > 0):
		return nil, fmt.Errorf("exec request %s: an attach with a command or a port; a session is one of the three", x.ID)
	case x.Attach:
	case x.Port != 0 && len(x.Command) > 0:
		return nil, fmt.Errorf("exec request %s: both a command and a port; a session is one or the other", x.ID)
	case x.Port != 0 && (x.Port < 1 || x.Port > 65535):
		return nil, fmt.Errorf("exec request %s: port %d is not a TCP port", x.ID, x.Port)
	case x.Port == 0 && (len(x.Command) == 0 || x.Command[0] == ""):
		return nil, fmt.Errorf("exec request %s: no command", x.ID)
	}
	if k, err := base64.StdEncoding.DecodeString(x.ClientKey); err != nil || len(k) != 32 {
		return nil, fmt.Errorf("exec request %s: clientKey must be a 32-byte X25519 key in base64", x.ID)
	}
	if x.NodeKeyID == "" {
		return nil, fmt.Errorf("exec request %s: no nodeKeyID", x.ID)
	}
	if x.Window <= 0 {
		return nil, fmt.Errorf("exec request %s: window %d must be positive", x.ID, x.Window)
	}
	return x, nil
}

// DecodeExecSealed decodes one sealed frame (or a refusal).
func DecodeExecSealed(payload []byte, max int) (*ExecSealed, error) {
	x, err := decodePayload[ExecSealed](payload, max, "exec frame")
	if err != nil {
		return nil, err
	}
	if err := ValidateRequestID(x.ID); err != nil {
		return nil, fmt.Errorf("exec frame: %w", err)
	}
	if x.Op != ExecFrame {
		return nil, fmt.Errorf("exec frame %s: op %q, want frame", x.ID, x.Op)
	}
	if len(x.Nonce) != 0 && len(x.Nonce) != ExecNonceSize {
		return nil, fmt.Errorf("exec frame %s/%d: a nonce of %d bytes, want %d", x.ID, x.Seq, len(x.Nonce), ExecNonceSize)
	}
	if len(x.Box) > MaxExecBox {
		return nil, fmt.Errorf("exec frame %s/%d: %d bytes sealed, more than %d", x.ID, x.Seq, len(x.Box), MaxExecBox)
	}
	return x, nil
}

// execDomain starts the bytes an exec request signature covers: distinct from a logs request's,
// so a signature over one can never pass for the other.
const execDomain = "mqlet.io/v2 exec request\n"

// ExecRequestSigningBytes are the bytes an exec request signature covers: the node it is for and
// the request's JSON without the signature.
func ExecRequestSigningBytes(node string, r *ExecRequest) []byte {
	c := *r
	c.Signature = nil
	b, _ := json.Marshal(&c) // plain fields: cannot fail
	return append([]byte(execDomain+"node "+node+"\n"), b...)
}

// SignExecRequest signs r for node with key, valid until r.Expires (set it first).
func SignExecRequest(node string, r *ExecRequest, key ed25519.PrivateKey) {
	r.Signature = nil
	r.Signature = signRequest(key, ExecRequestSigningBytes(node, r))
}

// VerifyExecRequest checks that r is for node, signed by one of anchors, and not expired at now
// (at most MaxLogsRequestLife ahead, as logs requests).
func VerifyExecRequest(node string, r *ExecRequest, anchors []ed25519.PublicKey, now time.Time) error {
	if r.Signature == nil {
		return fmt.Errorf("exec request %s: %w, and this node serves only signed ones", r.ID, errUnsignedRequest)
	}
	return verifyRequest("exec request "+r.ID, r.Signature, r.Expires, ExecRequestSigningBytes(node, r), anchors, now)
}
