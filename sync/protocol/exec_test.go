package protocol

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"strings"
	"testing"
	"time"
)

func execOpen() ExecRequest {
	return ExecRequest{APIVersion: APIVersion, ID: "exec-1", Op: ExecOpen, Namespace: "default", Pod: "web",
		Command: []string{"sh"}, ClientKey: base64.StdEncoding.EncodeToString(make([]byte, 32)), NodeKeyID: "0011223344556677", Window: 1024}
}

func TestDecodeExecRequestRefusesBadOpens(t *testing.T) {
	for name, tc := range map[string]struct {
		mod  func(*ExecRequest)
		want string
	}{
		"command and port":   {func(r *ExecRequest) { r.Port = 80 }, "both a command and a port"},
		"attach and command": {func(r *ExecRequest) { r.Attach = true }, "an attach with a command or a port"},
		"attach and port":    {func(r *ExecRequest) { r.Command, r.Attach, r.Port = nil, true, 80 }, "an attach with a command or a port"},
		"neither":            {func(r *ExecRequest) { r.Command = nil }, "no command"},
		"bad port":           {func(r *ExecRequest) { r.Command, r.Port = nil, 70000 }, "not a TCP port"},
		"short key":          {func(r *ExecRequest) { r.ClientKey = "AAAA" }, "32-byte X25519"},
		"no window":          {func(r *ExecRequest) { r.Window = 0 }, "window 0"},
		"bad container":      {func(r *ExecRequest) { r.Container = "A_B" }, "container name"},
	} {
		r := execOpen()
		tc.mod(&r)
		b, _ := Encode(&r)
		if _, err := DecodeExecRequest(b, 0); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", name, err, tc.want)
		}
	}
	r := execOpen()
	b, _ := Encode(&r)
	if _, err := DecodeExecRequest(b, 0); err != nil {
		t.Errorf("a good open: %v", err)
	}
	r.Command, r.Attach = nil, true
	b, _ = Encode(&r)
	if _, err := DecodeExecRequest(b, 0); err != nil {
		t.Errorf("a good attach: %v", err)
	}
}

// An exec signature covers the client key and cannot pass for a logs request's (own domain).
func TestExecRequestSignature(t *testing.T) {
	pub, key, _ := ed25519.GenerateKey(rand.Reader)
	now := time.Now()
	r := execOpen()
	r.Expires = now.Add(time.Minute).UTC().Truncate(time.Second)
	SignExecRequest("n1", &r, key)
	if err := VerifyExecRequest("n1", &r, []ed25519.PublicKey{pub}, now); err != nil {
		t.Fatal(err)
	}
	if err := VerifyExecRequest("n2", &r, []ed25519.PublicKey{pub}, now); err == nil {
		t.Error("verified for another node")
	}
	swapped := r
	swapped.ClientKey = base64.StdEncoding.EncodeToString(append(make([]byte, 31), 1))
	if err := VerifyExecRequest("n1", &swapped, []ed25519.PublicKey{pub}, now); err == nil {
		t.Error("verified with the client key replaced")
	}
	l := LogsRequest{APIVersion: APIVersion, ID: r.ID, Op: LogsOpen, Namespace: "default", Pod: "web", Expires: r.Expires, Signature: r.Signature}
	if err := VerifyLogsRequest("n1", &l, []ed25519.PublicKey{pub}, now); err == nil {
		t.Error("an exec signature verified as a logs request's")
	}
}
