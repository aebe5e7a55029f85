package ctlclient

import (
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/internal/mqtttest"
	"github.com/mqlet/mqlet/sync/protocol"
	"github.com/mqlet/mqlet/sync/sealing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestSnapshotEmptyNeedsNoTimeout(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	c := dial(t, b)
	// A snapshot that waited for its timeout returns an error: success means the marker ended it.
	got, err := c.Snapshot(testCtx(t), tp.AllNodes(protocol.ClassIndex))
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	if len(got) != 0 {
		t.Errorf("Snapshot of an empty broker = %v", got)
	}
}

func TestSnapshotIsExactlyTheRetainedMessages(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	raw := rawClient(t, b.Plain)
	want := map[string][]byte{}
	for i, node := range []string{"n1", "n2", "n3"} {
		topic := tp.Index(node)
		payload := []byte(strings.Repeat("x", i+1))
		pub(t, raw, topic, payload, true)
		want[topic] = payload
	}
	pub(t, raw, tp.Index("gone"), "y", true)
	pub(t, raw, tp.Index("gone"), "", true) // clears the retained message
	pub(t, raw, tp.Index("live"), "z", false)
	pub(t, raw, tp.Events("n1"), "e", false)
	pub(t, raw, tp.Acks("n1"), "a", true) // retained, but outside the filter

	c := dial(t, b)
	for round := range 2 { // the second round must see them again, not nothing
		got, err := c.Snapshot(testCtx(t), tp.AllNodes(protocol.ClassIndex), tp.AllNodes(protocol.ClassEvents))
		if err != nil {
			t.Fatalf("Snapshot: %v", err)
		}
		if !maps.EqualFunc(got, want, func(a, b []byte) bool { return string(a) == string(b) }) {
			t.Errorf("round %d: Snapshot = %q, want %q", round, got, want)
		}
	}
}

func TestConnectErrorsNameTheBroker(t *testing.T) {
	ctx := testCtx(t)
	for _, c := range []struct {
		o    Options
		want string
	}{
		{Options{Broker: "http://x"}, `scheme "http"`},
		{Options{Broker: "tcp://"}, "names no host"},
		{Options{Broker: "tcp://u:secret@h:1"}, "not in the URL"},
		{Options{Broker: "tcp://127.0.0.1:1", CAFile: "/x"}, "not TLS"},
		{Options{Broker: "ssl://127.0.0.1:1", CertFile: "/x"}, "both a certificate file and a key file"},
		{Options{Broker: "tcp://127.0.0.1:1", ClientID: "a/b"}, "marker topic"},
		{Options{Broker: "tcp://127.0.0.1:1", Username: "a+b"}, `username "a+b" cannot name the marker topic`},
		{Options{Broker: "tcp://127.0.0.1:1", TopicPrefix: "a/#"}, "wildcard"},
		{Options{Broker: "tcp://127.0.0.1:1", Timeout: time.Second}, "connect tcp://127.0.0.1:1"},
	} {
		_, err := Connect(ctx, c.o)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Connect(%+v) = %v, want an error with %q", c.o, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("Connect error shows the password: %v", err)
		}
	}
}

func TestTLSWithClientCertificate(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{Identities: []string{"n1"}})
	ctx := testCtx(t)
	cert, key := b.ClientCert(mqtttest.Admin)
	c, err := Connect(ctx, Options{Broker: b.TLS, CAFile: b.CAFile, CertFile: cert, KeyFile: key, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("Connect over TLS as admin: %v", err)
	}
	defer c.Close()
	if c.marker != "mqlet/v2/ctl/admin/marker" {
		t.Errorf("marker topic %q, want the certificate's CN in it (the ACL grants <prefix>/ctl/%%u/#)", c.marker)
	}
	if _, err := c.Apply(ctx, "n1", []any{pod("web")}); err != nil {
		t.Fatalf("Apply over TLS: %v", err)
	}

	// A node's identity may not use the ctl's marker topic: the snapshot says so instead of
	// returning an empty answer.
	cert, key = b.ClientCert("n1")
	n, err := Connect(ctx, Options{Broker: b.TLS, CAFile: b.CAFile, CertFile: cert, KeyFile: key, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatalf("Connect over TLS as n1: %v", err)
	}
	defer n.Close()
	_, err = n.Index(ctx, "n1")
	if err == nil || !strings.Contains(err.Error(), "marker") {
		t.Errorf("Index as a node identity = %v, want an error about the marker topic", err)
	}
}

// desired reads node's retained desired messages back, decoded, by object key.
func desired(t *testing.T, c *Client, node string) map[string]*protocol.DesiredObject {
	t.Helper()
	got, err := c.Snapshot(testCtx(t), tp.DesiredFilter(node))
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	out := map[string]*protocol.DesiredObject{}
	for topic, payload := range got {
		tt, err := tp.Parse(topic)
		if err != nil {
			t.Fatalf("retained topic: %v", err)
		}
		d, err := protocol.DecodeDesired(tt, payload, 0)
		if err != nil {
			t.Fatalf("retained %s: %v", topic, err)
		}
		out[d.Key()] = d
	}
	return out
}

func index(t *testing.T, c *Client, node string) *protocol.Index {
	t.Helper()
	idx, err := c.Index(testCtx(t), node)
	if err != nil {
		t.Fatalf("Index: %v", err)
	}
	return idx
}

// gens is an index's generations by key.
func gens(idx *protocol.Index) map[string]int64 {
	out := map[string]int64{}
	for k, e := range idx.Objects {
		out[k] = e.Generation
	}
	return out
}

func TestApplyAndDelete(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	c := dial(t, b)
	ctx := testCtx(t)
	const node = "edge-1"
	web, db := protocol.ObjectKey(protocol.KindPod, "default", "web"), protocol.ObjectKey(protocol.KindPod, "default", "db")

	// A first apply with no index yet: R = 0, so generation 1.
	res, err := c.Apply(ctx, node, []any{pod("web"), pod("db")})
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	if res.Generation != 1 || len(res.Objects) != 2 || !res.Objects[0].Created || res.Objects[0].Key() != web {
		t.Errorf("Apply = %+v, want generation 1 and two created pods, web first", res)
	}
	d := desired(t, c, node)
	if len(d) != 2 || d[web].Generation != 1 || d[db].Generation != 1 || d[web].Pod == nil || d[web].Pod.Name != "web" {
		t.Fatalf("retained desired after the first apply: %+v", d)
	}
	if idx := index(t, c, node); idx.Revision != 1 || !maps.Equal(gens(idx), map[string]int64{web: 1, db: 1}) {
		t.Fatalf("index after the first apply: %+v", idx)
	}

	// Apply again: the generation grows from the index's revision, for every object of the apply;
	// the others keep theirs.
	p := pod("web")
	p.Spec.Containers[0].Image = "busybox:2"
	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cfg"}, Data: map[string]string{"k": "v"}}
	sec := &v1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: "kube-system"}, Data: map[string][]byte{"k": []byte("v")}}
	// A Secret goes sealed to the key the node publishes in its status, and is refused without one.
	if _, err := c.Apply(ctx, node, []any{sec}); err == nil || !strings.Contains(err.Error(), "sealing key is unknown") {
		t.Fatalf("Apply of a secret to a node without a status: %v, want a refusal naming the sealing key", err)
	}
	key := publishSealingKey(t, b, node)
	res, err = c.Apply(ctx, node, []any{p, cm, sec})
	if err != nil {
		t.Fatalf("second Apply: %v", err)
	}
	if res.Generation != 2 || res.Objects[0].Created || !res.Objects[1].Created {
		t.Errorf("second Apply = %+v, want generation 2, web configured and cfg created", res)
	}
	cmKey, secKey := protocol.ObjectKey(protocol.KindConfigMap, "default", "cfg"), protocol.ObjectKey(protocol.KindSecret, "kube-system", "s")
	d = desired(t, c, node)
	if d[web].Generation != 2 || d[web].Pod.Spec.Containers[0].Image != "busybox:2" || d[db].Generation != 1 ||
		d[cmKey].ConfigMap == nil || d[secKey].Secret == nil || len(d[secKey].Secret.Data) != 0 || d[secKey].Sealed == nil {
		t.Errorf("retained desired after the second apply: %+v", d)
	}
	if err := key.Open(node, d[secKey].Secret, d[secKey].Sealed); err != nil || string(d[secKey].Secret.Data["k"]) != "v" {
		t.Errorf("the sealed secret opened with the node's key: %q, %v", d[secKey].Secret.Data, err)
	}
	if idx := index(t, c, node); idx.Revision != 2 || !maps.Equal(gens(idx), map[string]int64{web: 2, db: 1, cmKey: 2, secKey: 2}) {
		t.Errorf("index after the second apply: %+v", idx)
	}

	// Every index entry carries the digest of the exact retained payload.
	got, _ := c.Snapshot(ctx, tp.DesiredFilter(node))
	for k, e := range index(t, c, node).Objects {
		kind, ns, name, _ := protocol.ParseObjectKey(k)
		if payload := got[tp.Desired(node, kind, ns, name)]; protocol.Digest(payload) != e.Digest {
			t.Errorf("index entry %s has digest %s, the retained payload %s", k, e.Digest, protocol.Digest(payload))
		}
	}

	// Delete: the index without the object at the next revision, then the object's topic cleared.
	gen, err := c.Delete(ctx, node, protocol.KindPod, "default", "db")
	if err != nil || gen != 3 {
		t.Fatalf("Delete = %d, %v; want revision 3", gen, err)
	}
	d = desired(t, c, node)
	if _, still := d[db]; still {
		t.Errorf("retained db after delete = %+v, want the topic cleared", d[db])
	}
	if idx := index(t, c, node); idx.Revision != 3 || !maps.Equal(gens(idx), map[string]int64{web: 2, cmKey: 2, secKey: 2}) {
		t.Errorf("index after delete: %+v", idx)
	}
	// Deleting it again (or anything never applied) is not found, and writes nothing.
	for _, name := range []string{"db", "never"} {
		if _, err := c.Delete(ctx, node, protocol.KindPod, "default", name); !errors.Is(err, ErrNotFound) {
			t.Errorf("Delete %s = %v, want ErrNotFound", name, err)
		}
	}
	if idx := index(t, c, node); idx.Revision != 3 {
		t.Errorf("a refused delete wrote the index: revision %d", idx.Revision)
	}

	// Refused before anything is written.
	for _, objs := range [][]any{nil, {pod("web"), pod("web")}, {pod("Bad_Name")}, {"not an object"}} {
		if _, err := c.Apply(ctx, node, objs); err == nil {
			t.Errorf("Apply(%v) succeeded", objs)
		}
	}
	if _, err := c.Apply(ctx, "Bad_Node", []any{pod("web")}); err == nil {
		t.Errorf("Apply to an invalid node name succeeded")
	}
	if idx := index(t, c, node); idx.Revision != 3 {
		t.Errorf("a refused apply wrote the index: revision %d", idx.Revision)
	}
}

func TestApplyFailsWhenTheConnectionIsGone(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	c := dial(t, b)
	b.Kill(t)
	_, err := c.Apply(testCtx(t), "n1", []any{pod("web")})
	if err == nil {
		t.Fatalf("Apply with the broker killed succeeded")
	}
	t.Logf("Apply with the broker killed: %v", err)
}

func TestApplyRefusesAnUnreadableIndex(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	pub(t, rawClient(t, b.Plain), tp.Index("n1"), `{"apiVersion":"mqlet.io/v2","node":"n1","revision":3,"objects":{},"extra":1}`, true)
	_, err := dial(t, b).Apply(testCtx(t), "n1", []any{pod("web")})
	if err == nil || !strings.Contains(err.Error(), "retained index of node n1") {
		t.Errorf("Apply over an unreadable index = %v, want an error naming it", err)
	}
}

func TestNodesStaleOffline(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	raw := rawClient(t, b.Plain)
	ctx := testCtx(t)
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	pub(t, raw, tp.Liveness("n1"), &protocol.Liveness{Node: "n1", Online: true, Session: 5, Time: t0, Version: "v1.2"}, true)
	ready := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: v1.NodeStatus{
		Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}}}}
	pub(t, raw, tp.NodeStatus("n1"), &protocol.NodeStatus{Node: "n1", Object: ready}, true)
	pub(t, raw, tp.Liveness("n2"), &protocol.Liveness{Node: "n2", Online: false, Session: 2, Time: t0}, true)
	pub(t, raw, tp.Liveness("n3"), `{"broken`, true)

	c := dial(t, b)
	l, err := c.Nodes(ctx)
	if err != nil {
		t.Fatalf("Nodes: %v", err)
	}
	names := func(l *NodeList) []string {
		var s []string
		for _, n := range l.Items {
			s = append(s, n.Name+"="+n.State)
		}
		return s
	}
	if got := names(l); !slices.Equal(got, []string{"n1=online", "n2=offline"}) || len(l.Skipped) != 1 {
		t.Fatalf("Nodes = %v, skipped %v", got, l.Skipped)
	}
	if n := l.Items[0]; n.Session != 5 || !n.Since.Equal(t0) || n.Version != "v1.2" || n.Status == nil {
		t.Errorf("n1 = %+v", n)
	}

	// The Will of session 4, delivered after session 5 came online, is stale: this client saw 5.
	pub(t, raw, tp.Liveness("n1"), &protocol.Liveness{Node: "n1", Online: false, Session: 4}, true)
	n, _, err := c.Node(ctx, "n1")
	if err != nil {
		t.Fatalf("Node: %v", err)
	}
	if n.State != StateOnline || !n.StaleOffline || n.Session != 5 || !n.Since.Equal(t0) {
		t.Errorf("after a stale offline: %+v, want online in session 5 since %s", n, t0)
	}

	// A fresh client never saw session 5 online: the retained offline is all it knows...
	fresh := dial(t, b)
	if n, _, err := fresh.Node(ctx, "n1"); err != nil || n.State != StateOffline {
		t.Errorf("fresh client: %+v, %v; want offline", n, err)
	}
	// ... until the node's acks show that session 5 was connected.
	pub(t, raw, tp.Acks("n1"), &protocol.Acks{Node: "n1", Session: 5, Applied: map[string]protocol.IndexEntry{}}, true)
	if n, _, err := fresh.Node(ctx, "n1"); err != nil || n.State != StateOnline || !n.StaleOffline {
		t.Errorf("fresh client with acks of session 5: %+v, %v; want online", n, err)
	}
	// An offline of the current session is not stale.
	pub(t, raw, tp.Liveness("n1"), &protocol.Liveness{Node: "n1", Online: false, Session: 5}, true)
	if n, _, err := c.Node(ctx, "n1"); err != nil || n.State != StateOffline || n.StaleOffline {
		t.Errorf("offline of session 5: %+v, %v; want offline", n, err)
	}
	if _, _, err := c.Node(ctx, "nobody"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Node(nobody) = %v, want ErrNotFound", err)
	}
}

func TestPods(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	raw := rawClient(t, b.Plain)
	for _, s := range []*protocol.PodStatus{
		{Node: "n2", Namespace: "default", Name: "b", Source: "mqtt", Generation: 3, Object: pod("b")},
		{Node: "n1", Namespace: "default", Name: "a", Source: "file", Object: pod("a")},
		{Node: "n1", Namespace: "default", Name: "gone", Source: "mqtt", Deleted: true},
		{Node: "n1", Namespace: "default", Name: "liar"}, // published on another pod's topic below
	} {
		topic := tp.PodStatus(s.Node, s.Namespace, s.Name)
		if s.Name == "liar" {
			topic = tp.PodStatus("n1", "default", "other")
		}
		pub(t, raw, topic, s, true)
	}
	pub(t, raw, tp.PodStatus("n1", "default", "junk"), "{}", true)

	c := dial(t, b)
	l, err := c.Pods(testCtx(t), "")
	if err != nil {
		t.Fatalf("Pods: %v", err)
	}
	var got []string
	for _, p := range l.Items {
		got = append(got, p.Node+"/"+p.Name)
	}
	if !slices.Equal(got, []string{"n1/a", "n2/b"}) || len(l.Skipped) != 2 {
		t.Errorf("Pods = %v, skipped %v; want n1/a, n2/b and two skipped", got, l.Skipped)
	}
	l, err = c.Pods(testCtx(t), "n2")
	if err != nil || len(l.Items) != 1 || l.Items[0].Generation != 3 {
		t.Errorf("Pods(n2) = %+v, %v", l, err)
	}
}

func TestConcurrentAppliesOfOneClientDrawDistinctGenerations(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	c := dial(t, b)
	ctx := testCtx(t)
	errs := make(chan error, 5)
	for i := range 5 {
		go func() {
			_, err := c.Apply(ctx, "n1", []any{pod(fmt.Sprintf("p%d", i))})
			errs <- err
		}()
	}
	for range 5 {
		if err := <-errs; err != nil {
			t.Fatalf("Apply: %v", err)
		}
	}
	idx := index(t, c, "n1")
	gens := map[int64]bool{}
	for _, e := range idx.Objects {
		gens[e.Generation] = true
	}
	if idx.Revision != 5 || len(idx.Objects) != 5 || len(gens) != 5 {
		t.Errorf("index after 5 concurrent applies: %+v, want revision 5 and five distinct generations", idx)
	}
}

// After the broker lost the retained index, the counter goes on above what the node's acks show,
// not from 1 again: the node would refuse the lower generations as stale.
func TestApplyCountsAboveTheAcks(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	pub(t, rawClient(t, b.Plain), tp.Acks("n1"), &protocol.Acks{Node: "n1", Session: 3, IndexRevision: 9,
		Applied: map[string]protocol.IndexEntry{"pods/default/web": {Generation: 9, Digest: protocol.Digest([]byte("w"))}},
		Refused: map[string]protocol.Refusal{"pods/default/old": {Generation: 8, Digest: protocol.Digest([]byte("o")), Reason: "policy"}}}, true)
	c := dial(t, b)
	res, err := c.Apply(testCtx(t), "n1", []any{pod("web")})
	if err != nil || res.Generation != 10 {
		t.Fatalf("Apply = %+v, %v; want generation 10", res, err)
	}
	if gen, err := c.Delete(testCtx(t), "n1", protocol.KindPod, "default", "web"); err != nil || gen != 11 {
		t.Errorf("Delete = %d, %v; want generation 11", gen, err)
	}
}

// publishSealingKey publishes, as node would, a node status carrying a fresh sealing key, and
// returns the key.
func publishSealingKey(t *testing.T, b *mqtttest.Broker, node string) *sealing.Key {
	t.Helper()
	key, err := sealing.Generate()
	if err != nil {
		t.Fatal(err)
	}
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Annotations: map[string]string{sealing.AnnotationKey: key.Public()}}}
	pub(t, rawClient(t, b.Plain), tp.NodeStatus(node), &protocol.NodeStatus{Node: node, Object: n}, true)
	return key
}

// A broker that puts its own sealing key in a node's retained status gets nothing sealed to it
// from a ctl that knows the fleet's CA: only a key the node's certificate vouches for is used. A
// ctl without the CA seals to whatever key it is handed, and says so.
func TestSealingKeyMustBeVouchedForByTheNodesCertificate(t *testing.T) {
	const node = "edge-1"
	b := mqtttest.Start(t, mqtttest.Options{Identities: []string{node, "site-factory1"}})
	ctx := testCtx(t)
	verifying := verifyingClient(t, b)
	trusting := dial(t, b)
	sec := func() *v1.Secret {
		return &v1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: "default"}, Data: map[string][]byte{"k": []byte("v")}}
	}
	status := func(n *v1.Node) {
		t.Helper()
		pub(t, rawClient(t, b.Plain), tp.NodeStatus(node), &protocol.NodeStatus{Node: node, Object: n}, true)
	}
	// attested is the status a node with the identity certificate of cn would publish.
	attested := func(cn string, k *sealing.Key) *v1.Node {
		t.Helper()
		certFile, keyFile := b.ClientCert(cn)
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		a, err := sealing.Attest(cert, node, k)
		if err != nil {
			t.Fatal(err)
		}
		return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Annotations: map[string]string{sealing.AnnotationKey: k.Public(), sealing.AttestationKey: a}}}
	}
	nodeKey, _ := sealing.Generate()
	brokerKey, _ := sealing.Generate()
	own := attested(node, nodeKey)

	forgeries := map[string]*v1.Node{
		"the broker's key, no attestation": {ObjectMeta: metav1.ObjectMeta{Name: node, Annotations: map[string]string{sealing.AnnotationKey: brokerKey.Public()}}},
		"the broker's key with the node's attestation": func() *v1.Node {
			n := own.DeepCopy()
			n.Annotations[sealing.AnnotationKey] = brokerKey.Public()
			return n
		}(),
		"the broker's key attested by a site gateway's certificate": attested("site-factory1", brokerKey),
	}
	for name, forged := range forgeries {
		status(forged)
		if _, err := verifying.Apply(ctx, node, []any{sec()}); err == nil || !strings.Contains(err.Error(), "not vouched for by its certificate") {
			t.Errorf("%s: Apply = %v, want a refusal saying the key is not vouched for", name, err)
		}
	}
	// Nothing was sealed to the broker's key.
	if d := desired(t, trusting, node); len(d) != 0 {
		t.Fatalf("desired state after refused applies: %v", d)
	}

	status(own)
	res, err := verifying.Apply(ctx, node, []any{sec()})
	if err != nil {
		t.Fatalf("Apply with the node's attested key: %v", err)
	}
	if slices.ContainsFunc(res.Warnings, func(w string) bool { return strings.Contains(w, "sealing key") }) {
		t.Errorf("a warning about the sealing key, though it was verified: %v", res.Warnings)
	}
	d := desired(t, trusting, node)
	o := d[protocol.ObjectKey(protocol.KindSecret, "default", "s")]
	if o == nil || o.Sealed == nil || o.Sealed.KeyID != nodeKey.ID() {
		t.Fatalf("the secret is not sealed to the node's key %s: %+v", nodeKey.ID(), o)
	}

	// Without the CA the broker's key is used, with a warning naming it.
	status(forgeries["the broker's key, no attestation"])
	res, err = trusting.Apply(ctx, node, []any{sec()})
	if err != nil {
		t.Fatalf("Apply without a node CA: %v", err)
	}
	if !slices.ContainsFunc(res.Warnings, func(w string) bool { return strings.Contains(w, brokerKey.ID()) }) {
		t.Errorf("warnings = %v, want one naming the unverified key %s", res.Warnings, brokerKey.ID())
	}
}

// verifyingClient connects over TLS as the broker's admin and seals Secrets only to keys the
// harness CA's node certificates vouch for.
func verifyingClient(t *testing.T, b *mqtttest.Broker) *Client {
	t.Helper()
	nodes, err := sealing.LoadNodeTrust(b.CAFile, "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	adminCert, adminKey := b.ClientCert(mqtttest.Admin)
	c, err := Connect(testCtx(t), Options{Broker: b.TLS, CAFile: b.CAFile, CertFile: adminCert, KeyFile: adminKey, Timeout: 5 * time.Second, NodeTrust: nodes})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}
