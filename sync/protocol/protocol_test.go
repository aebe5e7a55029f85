package protocol

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var tp = MustTopics(DefaultPrefix)

func TestTopicsRoundTrip(t *testing.T) {
	cases := []struct {
		topic string
		want  Topic
	}{
		{tp.Desired("edge-1", KindPod, "default", "web"), Topic{Class: ClassDesired, Node: "edge-1", Kind: KindPod, Namespace: "default", Name: "web"}},
		{tp.Desired("edge-1", KindSecret, "ns", "s.1"), Topic{Class: ClassDesired, Node: "edge-1", Kind: KindSecret, Namespace: "ns", Name: "s.1"}},
		{tp.Index("edge-1"), Topic{Class: ClassIndex, Node: "edge-1"}},
		{tp.Liveness("edge-1"), Topic{Class: ClassLiveness, Node: "edge-1"}},
		{tp.NodeStatus("edge-1"), Topic{Class: ClassNodeStatus, Node: "edge-1"}},
		{tp.PodStatus("edge-1", "kube-system", "p"), Topic{Class: ClassPodStatus, Node: "edge-1", Kind: KindPod, Namespace: "kube-system", Name: "p"}},
		{tp.Events("edge-1"), Topic{Class: ClassEvents, Node: "edge-1"}},
		{tp.Acks("edge-1"), Topic{Class: ClassAcks, Node: "edge-1"}},
		{tp.Resync("edge-1"), Topic{Class: ClassResync, Node: "edge-1"}},
		{tp.LogsRequest("edge-1"), Topic{Class: ClassLogsRequest, Node: "edge-1"}},
		{tp.LogsReply("edge-1", "abc_1"), Topic{Class: ClassLogsReply, Node: "edge-1", ID: "abc_1"}},
	}
	for _, c := range cases {
		got, err := tp.Parse(c.topic)
		if err != nil {
			t.Errorf("Parse(%q): %v", c.topic, err)
			continue
		}
		if got != c.want {
			t.Errorf("Parse(%q) = %+v, want %+v", c.topic, got, c.want)
		}
		if !strings.HasPrefix(c.topic, "mqlet/v2/nodes/edge-1/") {
			t.Errorf("%q is outside the node's ACL subtree", c.topic)
		}
	}
}

func TestTopicsRefused(t *testing.T) {
	for _, topic := range []string{
		"other/v1/nodes/edge-1/index",
		"mqlet/v2/nodes/edge-1",
		"mqlet/v2/nodes/Edge_1/index",
		"mqlet/v2/nodes/edge-1/unknown",
		"mqlet/v2/nodes/edge-1/desired/pods/default",
		"mqlet/v2/nodes/edge-1/desired/deployments/default/x",
		"mqlet/v2/nodes/edge-1/desired/pods/default/x/y",
		"mqlet/v2/nodes/edge-1/desired/pods/../x",
		"mqlet/v2/nodes/edge-1/desired/pods/default/..",
		"mqlet/v2/nodes/edge-1/desired/pods/default/+",
		"mqlet/v2/nodes/edge-1/logs/resp/a.b",
		"mqlet/v2/nodes//index",
	} {
		if got, err := tp.Parse(topic); err == nil {
			t.Errorf("Parse(%q) = %+v, want an error", topic, got)
		}
	}
}

func TestValidatePrefix(t *testing.T) {
	for _, p := range []string{"a/+/b", "a/#", "/a", "a/", "a//b", "$SYS/x", strings.Repeat("a", 200)} {
		if _, err := NewTopics(p); err == nil {
			t.Errorf("NewTopics(%q): want an error", p)
		}
	}
	if tt, err := NewTopics(""); err != nil || tt.Prefix() != DefaultPrefix {
		t.Errorf("NewTopics(\"\") = %v, %v", tt.Prefix(), err)
	}
	if got := tp.AllNodes(ClassLiveness); got != "mqlet/v2/nodes/+/online" {
		t.Errorf("AllNodes(liveness) = %q", got)
	}
	if got := tp.AllNodes(ClassPodStatus); got != "mqlet/v2/nodes/+/status/pods/#" {
		t.Errorf("AllNodes(pod status) = %q", got)
	}
}

func pod(ns, name string) *v1.Pod {
	return &v1.Pod{
		TypeMeta:   metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       v1.PodSpec{Containers: []v1.Container{{Name: "c", Image: "busybox"}}},
	}
}

func mustEncode(t *testing.T, v any) []byte {
	t.Helper()
	b, err := Encode(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeDesired(t *testing.T) {
	topic, _ := tp.Parse(tp.Desired("edge-1", KindPod, "default", "web"))
	d, err := NewDesired("edge-1", 7, pod("", "web"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeDesired(topic, mustEncode(t, d), 0)
	if err != nil {
		t.Fatalf("good payload refused: %v", err)
	}
	if got.Pod == nil || got.Pod.Name != "web" || got.Generation != 7 || got.Key() != "pods/default/web" {
		t.Fatalf("decoded %+v", got)
	}

	// v1 tombstones are not part of v2: an unknown field, refused.
	if _, err := DecodeDesired(topic, []byte(`{"apiVersion":"mqlet.io/v2","kind":"Pod","node":"edge-1","namespace":"default","name":"web","generation":9,"deleted":true}`), 0); err == nil {
		t.Fatal("a v1 tombstone was accepted")
	}

	mutate := func(f func(m map[string]any)) []byte {
		var m map[string]any
		json.Unmarshal(mustEncode(t, d), &m)
		f(m)
		b, _ := json.Marshal(m)
		return b
	}
	bad := map[string]struct {
		payload []byte
		want    string
	}{
		"garbled":         {[]byte("{not json"), "invalid JSON"},
		"empty":           {nil, "empty payload"},
		"other node":      {mutate(func(m map[string]any) { m["node"] = "edge-2" }), `for node "edge-2"`},
		"kind vs topic":   {mutate(func(m map[string]any) { m["kind"] = "Secret" }), "does not match the topic"},
		"unknown kind":    {mutate(func(m map[string]any) { m["kind"] = "Deployment" }), "does not match"},
		"name vs topic":   {mutate(func(m map[string]any) { m["name"] = "api" }), "payload names"},
		"zero generation": {mutate(func(m map[string]any) { m["generation"] = 0 }), "must be positive"},
		"unknown field":   {mutate(func(m map[string]any) { m["extra"] = 1 }), `unknown field "extra"`},
		"api version":     {mutate(func(m map[string]any) { m["apiVersion"] = "mqlet.io/v1" }), "apiVersion"},
		"no object":       {mutate(func(m map[string]any) { delete(m, "object") }), "no object"},
		"v1 tombstone":    {mutate(func(m map[string]any) { m["deleted"] = true }), `unknown field "deleted"`},
		"object name": {mutate(func(m map[string]any) {
			m["object"].(map[string]any)["metadata"].(map[string]any)["name"] = "other"
		}), "object is default/other"},
		"object field": {mutate(func(m map[string]any) {
			m["object"].(map[string]any)["spec"].(map[string]any)["bogus"] = true
		}), `unknown field "spec.bogus"`},
		"object kind": {mutate(func(m map[string]any) { m["object"].(map[string]any)["kind"] = "Secret" }), `object kind "Secret"`},
	}
	for name, c := range bad {
		_, err := DecodeDesired(topic, c.payload, 0)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want one containing %q", name, err, c.want)
		}
	}

	big := mustEncode(t, d)
	if _, err := DecodeDesired(topic, big, len(big)-1); !errors.Is(err, ErrTooLarge) {
		t.Errorf("oversized: err = %v, want ErrTooLarge", err)
	}
}

func TestDecodeDesiredConfigMapAndSecret(t *testing.T) {
	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cfg"}, Data: map[string]string{"a": "b"}}
	d, _ := NewDesired("n1", 1, cm)
	topic, _ := tp.Parse(tp.Desired("n1", KindConfigMap, "ns", "cfg"))
	got, err := DecodeDesired(topic, mustEncode(t, d), 0)
	if err != nil || got.ConfigMap == nil || got.ConfigMap.Data["a"] != "b" {
		t.Fatalf("configmap: %+v, %v", got, err)
	}
	s := &v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "sec"}, Data: map[string][]byte{"k": []byte("v")}}
	d, _ = NewDesired("n1", 2, s)
	topic, _ = tp.Parse(tp.Desired("n1", KindSecret, "ns", "sec"))
	got, err = DecodeDesired(topic, mustEncode(t, d), 0)
	if err != nil || got.Secret == nil || string(got.Secret.Data["k"]) != "v" {
		t.Fatalf("secret: %+v, %v", got, err)
	}
}

func TestDecodeIndex(t *testing.T) {
	topic, _ := tp.Parse(tp.Index("n1"))
	dg := Digest([]byte("payload"))
	e := func(g int64) IndexEntry { return IndexEntry{Generation: g, Digest: dg} }
	good := &Index{Node: "n1", Revision: 5, Objects: map[string]IndexEntry{"pods/default/a": e(3), "secrets/ns/s": e(5)}}
	if got, err := DecodeIndex(topic, mustEncode(t, good), 0); err != nil || got.Objects["pods/default/a"] != e(3) {
		t.Fatalf("good index refused or misread: %+v, %v", got, err)
	}
	if len(dg) != 64 || dg != "239f59ed55e737c77147cf55ad0c1b030b6d7ee748a7426952f9b852d5a935e5" {
		t.Fatalf("Digest = %q, want the SHA-256 of the bytes in lowercase hex", dg)
	}
	for name, x := range map[string]*Index{
		"future generation": {Node: "n1", Revision: 5, Objects: map[string]IndexEntry{"pods/default/a": e(6)}},
		"bad key":           {Node: "n1", Revision: 5, Objects: map[string]IndexEntry{"pods/a": e(1)}},
		"no digest":         {Node: "n1", Revision: 5, Objects: map[string]IndexEntry{"pods/default/a": {Generation: 1}}},
		"uppercase digest":  {Node: "n1", Revision: 5, Objects: map[string]IndexEntry{"pods/default/a": {Generation: 1, Digest: strings.ToUpper(dg)}}},
		"short digest":      {Node: "n1", Revision: 5, Objects: map[string]IndexEntry{"pods/default/a": {Generation: 1, Digest: dg[:63]}}},
		"other node":        {Node: "n2", Revision: 5},
		"no revision":       {Node: "n1"},
	} {
		if _, err := DecodeIndex(topic, mustEncode(t, x), 0); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestLiveness(t *testing.T) {
	off := mustEncode(t, &Liveness{Node: "n1", Online: false, Session: 3})
	on := mustEncode(t, &Liveness{Node: "n1", Online: true, Session: 3})
	if !IsStaleOffline(off, 4) {
		t.Error("an offline of session 3 is stale for session 4")
	}
	if IsStaleOffline(off, 3) || IsStaleOffline(on, 4) || IsStaleOffline([]byte("x"), 4) {
		t.Error("only an older session's offline is stale")
	}
}

func TestDecodeLogsRequest(t *testing.T) {
	good := &LogsRequest{ID: "r1", Op: LogsOpen, Namespace: "default", Pod: "web", Container: "c", Tail: 10}
	if _, err := DecodeLogsRequest(mustEncode(t, good), 0); err != nil {
		t.Fatalf("good request refused: %v", err)
	}
	for name, x := range map[string]*LogsRequest{
		"path in pod":       {ID: "r1", Op: LogsOpen, Namespace: "default", Pod: "../../etc"},
		"path in container": {ID: "r1", Op: LogsOpen, Namespace: "default", Pod: "web", Container: "../x"},
		"bad id":            {ID: "r/1", Op: LogsOpen, Namespace: "default", Pod: "web"},
		"negative since":    {ID: "r1", Op: LogsOpen, Namespace: "default", Pod: "web", SinceSeconds: -5},
		"bad op":            {ID: "r1", Op: "exec", Namespace: "default", Pod: "web"},
	} {
		if _, err := DecodeLogsRequest(mustEncode(t, x), 0); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	chunk := mustEncode(t, &LogsChunk{ID: "r1", Data: make([]byte, MaxLogChunk+1)})
	if _, err := DecodeLogsChunk(chunk, 0); err == nil {
		t.Error("an oversized chunk was accepted")
	}
}

func TestParseObjectKey(t *testing.T) {
	k, ns, n, err := ParseObjectKey("configmaps/kube-system/x")
	if err != nil || k != KindConfigMap || ns != "kube-system" || n != "x" {
		t.Fatalf("got %v %v %v %v", k, ns, n, err)
	}
	for _, bad := range []string{"", "pods", "pods/a/b/c", "jobs/a/b", "pods/../x"} {
		if _, _, _, err := ParseObjectKey(bad); err == nil {
			t.Errorf("ParseObjectKey(%q) accepted", bad)
		}
	}
}
