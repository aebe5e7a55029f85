package pods

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mqlet/mqlet/core/satoken"
	"github.com/mqlet/mqlet/sync/protocol"
	authnv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// tokenAPI answers TokenRequests like the API server: token "tok-N" for the Nth request, valid
// for the asked lifetime from now, or fail when fail is set. It records the requests.
type tokenAPI struct {
	mu   sync.Mutex
	now  func() time.Time
	fail error
	reqs []tokenCall
}

type tokenCall struct {
	namespace, sa string
	spec          authnv1.TokenRequestSpec
}

func (a *tokenAPI) install(cs *fake.Clientset) {
	cs.PrependReactor("create", "serviceaccounts", func(act k8stesting.Action) (bool, runtime.Object, error) {
		c, ok := act.(k8stesting.CreateAction)
		if !ok || act.GetSubresource() != "token" {
			return false, nil, nil
		}
		tr := c.GetObject().(*authnv1.TokenRequest)
		a.mu.Lock()
		defer a.mu.Unlock()
		a.reqs = append(a.reqs, tokenCall{act.GetNamespace(), c.(k8stesting.CreateActionImpl).Name, tr.Spec})
		if a.fail != nil {
			return true, nil, a.fail
		}
		now := time.Now()
		if a.now != nil {
			now = a.now()
		}
		out := tr.DeepCopy()
		out.Status = authnv1.TokenRequestStatus{Token: fmt.Sprintf("tok-%d", len(a.reqs)),
			ExpirationTimestamp: metav1.NewTime(now.Add(time.Duration(*tr.Spec.ExpirationSeconds) * time.Second))}
		return true, out, nil
	})
}

func (a *tokenAPI) calls() []tokenCall {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]tokenCall(nil), a.reqs...)
}

func (a *tokenAPI) setFail(err error) {
	a.mu.Lock()
	a.fail = err
	a.mu.Unlock()
}

// The pod's kube-api-access volume reaches the node with its token projection turned into a
// projection of a Secret made for the pod; that Secret holds a token the API issued for the pod's
// service account, bound to the pod, for the projection's lifetime, and travels sealed. Renewed
// (here after a short maximum age), the node gets the new token in the same Secret, and the pod
// itself is not sent again. Its ca.crt (kube-root-ca.crt) and namespace sources are left as they
// are.
func TestServiceAccountTokenReachesTheNodeSealedAndIsRenewed(t *testing.T) {
	pod := apiPod("default", "web-1", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-000000000001")
	node, key := sealedNode(t, nodeA)
	api := &tokenAPI{}
	h := startWith(t, func(o *Options) {
		api.install(o.Kube.(*fake.Clientset))
		o.TokenMaxAge = 400 * time.Millisecond
	}, []string{nodeA}, pod, node,
		configMap("default", "web-config", map[string]string{"a": "1"}),
		configMap("default", "kube-root-ca.crt", map[string]string{"ca.crt": "PEM"}),
		secret("default", "web-secret", map[string][]byte{"token": []byte("x")}))

	name := tokenSecretName(pod.UID, 1, 0)
	d := h.desired(nodeA, protocol.KindPod, "default", "web-1")
	vol := d.Pod.Spec.Volumes[1]
	if vol.Projected == nil || len(vol.Projected.Sources) != 3 {
		t.Fatalf("kube-api-access volume on the node: %+v, want its three sources", vol)
	}
	src := vol.Projected.Sources
	if src[0].Secret == nil || src[0].Secret.Name != name || len(src[0].Secret.Items) != 1 ||
		src[0].Secret.Items[0] != (v1.KeyToPath{Key: tokenDataKey, Path: "token"}) || src[0].ServiceAccountToken != nil {
		t.Errorf("token source on the node: %+v, want secret %s key %s at path token", src[0], name, tokenDataKey)
	}
	if src[1].ConfigMap == nil || src[1].ConfigMap.Name != "kube-root-ca.crt" || src[2].DownwardAPI == nil {
		t.Errorf("the other sources changed: %+v", src[1:])
	}
	if len(d.Pod.Spec.Containers[0].VolumeMounts) != 2 {
		t.Errorf("mounts %+v: want the token volume still mounted", d.Pod.Spec.Containers[0].VolumeMounts)
	}
	if h.desired(nodeA, protocol.KindConfigMap, "default", "kube-root-ca.crt") == nil {
		t.Error("kube-root-ca.crt not sent")
	}

	opened := func() string {
		s := h.desired(nodeA, protocol.KindSecret, "default", name)
		if s.Sealed == nil || len(s.Secret.Data) != 0 {
			t.Fatalf("token secret sent as %+v, want it sealed", s.Secret)
		}
		if err := key.Open(nodeA, s.Secret, s.Sealed); err != nil {
			t.Fatalf("open the token secret: %v", err)
		}
		return string(s.Secret.Data[tokenDataKey])
	}
	if got := opened(); !strings.HasPrefix(got, "tok-") {
		t.Fatalf("token on the node %q", got)
	}
	c := api.calls()[0]
	if c.namespace != "default" || c.sa != "default" || *c.spec.ExpirationSeconds != 3607 || len(c.spec.Audiences) != 0 ||
		c.spec.BoundObjectRef == nil || *c.spec.BoundObjectRef != (authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: "web-1", UID: pod.UID}) {
		t.Errorf("token request %+v, want service account default/default, 3607 s, bound to pod web-1 %s", c, pod.UID)
	}

	first := opened()
	waitFor(t, "a renewed token on the node", func() bool {
		b := h.broker.get(topics.Desired(nodeA, protocol.KindSecret, "default", name))
		d := desiredOf(t, b, nodeA, protocol.KindSecret, "default", name)
		return key.Open(nodeA, d.Secret, d.Sealed) == nil && string(d.Secret.Data[tokenDataKey]) != first
	})
	podTopic := topics.Desired(nodeA, protocol.KindPod, "default", "web-1")
	h.broker.mu.Lock()
	n := 0
	for _, tp := range h.broker.log {
		if tp == podTopic {
			n++
		}
	}
	h.broker.mu.Unlock()
	if n != 1 {
		t.Errorf("the pod was published %d times while its token was renewed, want once", n)
	}

	// The pod deleted, its token is forgotten and its Secret leaves the node's set.
	if err := h.kube.CoreV1().Pods("default").Delete(context.Background(), "web-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.dropped(nodeA, protocol.ObjectKey(protocol.KindSecret, "default", name))
	waitFor(t, "the token cache emptied", func() bool {
		h.c.tokens.mu.Lock()
		defer h.c.tokens.mu.Unlock()
		return len(h.c.tokens.byNode) == 0
	})
}

// With --no-service-account-tokens the volume is stripped as before and the API is never asked.
func TestNoServiceAccountTokensStripsTheVolume(t *testing.T) {
	pod := apiPod("default", "web-1", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-000000000001")
	node, _ := sealedNode(t, nodeA)
	api := &tokenAPI{}
	h := startWith(t, func(o *Options) {
		api.install(o.Kube.(*fake.Clientset))
		o.NoServiceAccountTokens = true
	}, []string{nodeA}, pod, node, configMap("default", "web-config", map[string]string{"a": "1"}))
	d := h.desired(nodeA, protocol.KindPod, "default", "web-1")
	if len(d.Pod.Spec.Volumes) != 1 {
		t.Errorf("volumes %+v: want the token volume stripped", d.Pod.Spec.Volumes)
	}
	if n := len(api.calls()); n != 0 {
		t.Errorf("%d token requests with tokens off", n)
	}
}

// The cache asks the API only for a token that is new, due (80 % of its lifetime or the maximum
// age), or failed longer than tokenRetry ago; a failed renewal keeps the token the node has while
// it is valid.
func TestTokenCacheRenewsAtEightyPercentAndRetriesFailures(t *testing.T) {
	now := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	cs := fake.NewClientset()
	api := &tokenAPI{now: clock}
	api.install(cs)
	tk := newTokens(cs, 0)
	tk.now = clock
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: types.UID("u1")},
		Spec: v1.PodSpec{ServiceAccountName: "robot"}}
	src := &v1.ServiceAccountTokenProjection{Audience: "vault", ExpirationSeconds: ptr(int64(1000)), Path: "t"}
	ctx := context.Background()

	get := func(want string, wantCalls int) {
		t.Helper()
		got, err := tk.get(ctx, "n", p, src)
		if err != nil || got != want {
			t.Fatalf("at %s: token %q, %v; want %q", now.Format(time.TimeOnly), got, err, want)
		}
		if n := len(api.calls()); n != wantCalls {
			t.Fatalf("at %s: %d API calls, want %d", now.Format(time.TimeOnly), n, wantCalls)
		}
	}
	get("tok-1", 1)
	if c := api.calls()[0]; c.sa != "robot" || c.namespace != "ns" || len(c.spec.Audiences) != 1 || c.spec.Audiences[0] != "vault" {
		t.Errorf("request %+v: want service account ns/robot, audience vault", c)
	}
	now = now.Add(799 * time.Second)
	get("tok-1", 1)
	if d := tk.due(now); len(d) != 0 {
		t.Errorf("due at 79.9 %%: %v", d)
	}
	now = now.Add(time.Second)
	if d := tk.due(now); len(d) != 1 || d[0] != "n" {
		t.Errorf("due at 80 %%: %v, want [n]", d)
	}
	get("tok-2", 2)

	// The renewal fails: the valid token stays, and the API is not asked again before tokenRetry.
	api.setFail(errors.New("etcd is down"))
	now = now.Add(800 * time.Second)
	get("tok-2", 3)
	now = now.Add(tokenRetry - time.Second)
	get("tok-2", 3)
	if d := tk.due(now); len(d) != 0 {
		t.Errorf("due before the retry: %v", d)
	}
	now = now.Add(time.Second)
	if d := tk.due(now); len(d) != 1 {
		t.Errorf("not due after tokenRetry: %v", d)
	}
	// Past its expiry the old token is not handed out any more: the error is.
	now = now.Add(200 * time.Second)
	if _, err := tk.get(ctx, "n", p, src); err == nil || !strings.Contains(err.Error(), "etcd is down") || !strings.Contains(err.Error(), "ns/robot") {
		t.Errorf("expired and failing: %v, want the API's error naming the service account", err)
	}
	api.setFail(nil)
	now = now.Add(tokenRetry)
	get(fmt.Sprintf("tok-%d", len(api.calls())+1), len(api.calls())+1)

	// A lifetime longer than the maximum age is renewed at the maximum age.
	long := &v1.ServiceAccountTokenProjection{ExpirationSeconds: ptr(int64(365 * 24 * 3600))}
	calls := func(d time.Duration) int {
		t.Helper()
		now = now.Add(d)
		if _, err := tk.get(ctx, "n", p, long); err != nil {
			t.Fatal(err)
		}
		return len(api.calls())
	}
	base := calls(0)
	if n := calls(DefaultTokenMaxAge - time.Second); n != base {
		t.Errorf("the year-long token renewed before the maximum age")
	}
	if n := calls(time.Second); n != base+1 {
		t.Errorf("the year-long token not renewed at the maximum age")
	}

	tk.retain("n", map[types.UID]bool{"other": true})
	if len(tk.byNode) != 0 {
		t.Errorf("tokens of a gone pod kept: %v", tk.byNode)
	}
}

// A pod a node took from a bridge that stripped the token volume (an older bridge, or one with
// --no-service-account-tokens) keeps that form when a bridge with tokens takes over: adding the
// volume would restart its containers. A pod made afterwards gets its token.
func TestPodHeldWithoutTokenVolumeKeepsItsForm(t *testing.T) {
	old := apiPod("default", "web-1", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-000000000001")
	node, _ := sealedNode(t, nodeA)
	objs := []runtime.Object{old, node, configMap("default", "web-config", map[string]string{"a": "1"}),
		configMap("default", "kube-root-ca.crt", map[string]string{"ca.crt": "PEM"})}
	before := startWith(t, func(o *Options) { o.NoServiceAccountTokens = true }, []string{nodeA}, objs...)
	stripped := before.desired(nodeA, protocol.KindPod, "default", "web-1")
	if len(stripped.Pod.Spec.Volumes) != 1 {
		t.Fatalf("volumes %+v: want the token volume stripped", stripped.Pod.Spec.Volumes)
	}
	idx := before.index(nodeA)

	api := &tokenAPI{}
	h := startWith(t, func(o *Options) {
		api.install(o.Kube.(*fake.Clientset))
		o.Broker = before.broker
	}, []string{nodeA}, append(objs, apiPod("default", "web-2", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-000000000002"))...)
	h.broker = before.broker
	waitFor(t, "web-2 with its token", func() bool {
		i := h.index(nodeA)
		_, ok := i.Objects[protocol.ObjectKey(protocol.KindSecret, "default", tokenSecretName("6f1c2d3e-aaaa-4bbb-8ccc-000000000002", 1, 0))]
		return ok
	})
	key := protocol.ObjectKey(protocol.KindPod, "default", "web-1")
	if got := h.index(nodeA).Objects[key]; got != idx.Objects[key] {
		t.Errorf("web-1 sent again (%v, was %v): a running pod's spec changed under it", got, idx.Objects[key])
	}
	for _, c := range api.calls() {
		if c.spec.BoundObjectRef.Name == "web-1" {
			t.Errorf("a token was asked for web-1, which runs without its volume")
		}
	}
}

// A user's Secret named like a pod's token Secret (the name is predictable) is never sent in its
// place, even while the TokenRequest fails: the pod and the other objects go out, the reserved name
// does not (found by review: the references loop resolved it from the API). The bridge's own token
// Secret carries its pod's UID, so a node gives it to no other pod.
func TestReservedTokenSecretNameIsNotTakenFromTheAPI(t *testing.T) {
	pod := apiPod("default", "web-1", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-000000000001")
	node, _ := sealedNode(t, nodeA)
	api := &tokenAPI{}
	api.setFail(errors.New("serviceaccount default not found"))
	name := tokenSecretName(pod.UID, 1, 0)
	h := startWith(t, func(o *Options) { api.install(o.Kube.(*fake.Clientset)) }, []string{nodeA}, pod, node,
		configMap("default", "web-config", map[string]string{"a": "1"}),
		configMap("default", "kube-root-ca.crt", map[string]string{"ca.crt": "PEM"}),
		secret("default", "web-secret", map[string][]byte{"token": []byte("x")}),
		secret("default", name, map[string][]byte{"token": []byte("FORGED-BY-A-USER")}))
	h.desired(nodeA, protocol.KindSecret, "default", "web-secret") // everything else went out
	if _, listed := h.index(nodeA).Objects[protocol.ObjectKey(protocol.KindSecret, "default", name)]; listed {
		t.Fatalf("the user's Secret %s was sent as the pod's token", name)
	}

	api.setFail(nil)
	h.c.tokens.forget(nodeA) // ask again now, not after tokenRetry
	h.c.queueNode(nodeA)
	s := h.desired(nodeA, protocol.KindSecret, "default", name)
	if s.Secret.Annotations[satoken.AnnotationPodUID] != string(pod.UID) {
		t.Errorf("token Secret annotations %v: want %s naming pod %s", s.Secret.Annotations, satoken.AnnotationPodUID, pod.UID)
	}
}
