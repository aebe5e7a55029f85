package protocol

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// The fuzz targets check that no payload or topic makes a decoder panic, and that whatever a
// decoder accepts satisfies the checks the receiver relies on (names valid, sizes bounded).
// CI runs each for a bounded time (see Makefile's fuzz target).

func FuzzParseTopic(f *testing.F) {
	for _, s := range []string{tp.Desired("n", KindPod, "default", "a"), tp.Index("n"), tp.LogsReply("n", "x"),
		"mqlet/v2/nodes/n/desired/pods/../a", "mqlet/v2/nodes/+/online", "mqlet/v2/nodes/n/status/pods/a/b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := tp.Parse(s)
		if err != nil {
			return
		}
		if ValidateNodeName(got.Node) != nil {
			t.Fatalf("accepted node %q", got.Node)
		}
		if got.Class == ClassDesired || got.Class == ClassPodStatus {
			if ValidateObjectName(got.Kind, got.Namespace, got.Name) != nil {
				t.Fatalf("accepted object %+v", got)
			}
		}
	})
}

func FuzzDecodeDesired(f *testing.F) {
	d, _ := NewDesired("n", 3, pod("default", "a"))
	good, _ := Encode(d)
	f.Add(good)
	f.Add([]byte(`{"apiVersion":"mqlet.io/v2","kind":"Pod","node":"n","namespace":"default","name":"a","generation":4,"deleted":true}`))
	f.Add([]byte(`{"apiVersion":"mqlet.io/v2","kind":"Pod","node":"n","namespace":"default","name":"a","generation":1,"object":{"metadata":{"name":"a"},"spec":{"containers":[{"name":"c","image":"x"}]}}}`))
	f.Add([]byte(`{"kind":"Pod","object":null}`))
	topic, _ := tp.Parse(tp.Desired("n", KindPod, "default", "a"))
	f.Fuzz(func(t *testing.T, payload []byte) {
		got, err := DecodeDesired(topic, payload, 4096)
		if err != nil {
			return
		}
		if len(payload) > 4096 || got.Generation <= 0 || got.Node != "n" || got.Key() != "pods/default/a" {
			t.Fatalf("accepted %+v", got.Desired)
		}
		if got.Pod == nil || got.Pod.Name != "a" {
			t.Fatalf("accepted a pod named %q", got.Pod.Name)
		}
	})
}

var fuzzPub, fuzzPriv, _ = ed25519.GenerateKey(nil)

func FuzzDecodeIndex(f *testing.F) {
	good, _ := Encode(&Index{Node: "n", Revision: 4, Objects: map[string]IndexEntry{"pods/default/a": {Generation: 4, Digest: Digest([]byte("a"))}}})
	f.Add(good)
	signed := &Index{Node: "n", Revision: 4, Objects: map[string]IndexEntry{"pods/default/a": {Generation: 4, Digest: Digest([]byte("a"))}}}
	SignIndex(signed, fuzzPriv)
	sb, _ := Encode(signed)
	f.Add(sb)
	f.Add([]byte(`{"apiVersion":"mqlet.io/v2","node":"n","revision":1,"objects":{"pods/x":{"generation":1,"digest":"00"}}}`))
	f.Add([]byte(`{"apiVersion":"mqlet.io/v2","node":"n","revision":2,"objects":{"pods/default/a":{"generation":2,"digest":"` + strings.Repeat("A", 64) + `"}}}`))
	topic, _ := tp.Parse(tp.Index("n"))
	f.Fuzz(func(t *testing.T, payload []byte) {
		got, err := DecodeIndex(topic, payload, 4096)
		if err != nil {
			return
		}
		// Verification never panics, whatever the decoder let through.
		VerifyIndex(got, []ed25519.PublicKey{fuzzPub})
		for k, e := range got.Objects {
			if _, _, _, err := ParseObjectKey(k); err != nil || e.Generation <= 0 || e.Generation > got.Revision || !validDigest(e.Digest) {
				t.Fatalf("accepted entry %q=%+v (revision %d)", k, e, got.Revision)
			}
		}
	})
}

func FuzzDecodeLogsRequest(f *testing.F) {
	good, _ := Encode(&LogsRequest{ID: "a", Op: LogsOpen, Namespace: "default", Pod: "p", Container: "c", Follow: true})
	f.Add(good)
	f.Add([]byte(`{"apiVersion":"mqlet.io/v2","id":"a","op":"open","namespace":"default","pod":"../x"}`))
	exp := time.Date(2026, 11, 27, 12, 2, 0, 0, time.UTC)
	signed := &LogsRequest{APIVersion: APIVersion, ID: "s", Op: LogsOpen, Namespace: "default", Pod: "p", Expires: exp}
	SignLogsRequest("n", signed, fuzzPriv)
	sb, _ := Encode(signed)
	f.Add(sb)
	f.Fuzz(func(t *testing.T, payload []byte) {
		got, err := DecodeLogsRequest(payload, 4096)
		if err != nil {
			return
		}
		// Verification never panics, and a request it accepts re-encodes to what was signed:
		// changing any signed field (or the node) breaks it.
		if VerifyLogsRequest("n", got, []ed25519.PublicKey{fuzzPub}, exp.Add(-time.Minute)) == nil {
			if VerifyLogsRequest("m", got, []ed25519.PublicKey{fuzzPub}, exp.Add(-time.Minute)) == nil {
				t.Fatal("a request signed for node n verified for node m")
			}
		}
		if got.Op == LogsOpen {
			for _, s := range []string{got.Pod, got.Namespace, got.Container} {
				if bytes.ContainsAny([]byte(s), "/\x00") || s == ".." {
					t.Fatalf("accepted a name that could walk a path: %q", s)
				}
			}
		}
		if _, err := json.Marshal(got); err != nil {
			t.Fatal(err)
		}
	})
}
