package e2e

import (
	"context"
	"strings"
	"testing"

	authnv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestServiceAccountToken: a pod on the edge node with the kube-api-access volume the API injects
// gets what a kubelet gives it: a token the API server accepts for the pod's service account,
// bound to the pod, the cluster's CA and the namespace, at the usual path. The bridge renews the
// token (here after 4 s instead of a day) and the running container sees the new one in place; once
// the pod is deleted, the API server refuses its token.
func TestServiceAccountToken(t *testing.T) {
	w := newEdgeWorld(t)
	w.startBridgeWith(t, "bridge-a", "--service-account-token-max-age=4s")
	w.startAgent(t)
	ctx := context.Background()
	core := w.kube.CoreV1()

	ns := uniqueName("sa")
	if _, err := core.Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", ns, err)
	}
	t.Cleanup(func() { core.Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	if _, err := core.ServiceAccounts(ns).Create(ctx, &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "robot"}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create service account: %v", err)
	}
	within(t, readyBound, "kube-root-ca.crt in "+ns+" (the controller-manager's)", func() (bool, string) {
		_, err := core.ConfigMaps(ns).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err == nil, errString(err)
	})

	// The container prints the token whenever it changes, and the namespace and CA once.
	const dir = "/var/run/secrets/kubernetes.io/serviceaccount"
	p := edgePod(uniqueName("tok"))
	p.Spec.ServiceAccountName = "robot"
	p.Spec.Containers[0].Command = []string{"sh", "-c", `d=` + dir + `; echo "NS $(cat $d/namespace)"; echo "CA $(head -1 $d/ca.crt)"; last=
trap "exit 0" TERM
while true; do t=$(cat $d/token); if [ "$t" != "$last" ]; then echo "TOKEN $t"; last=$t; fi; sleep 0.3; done`}
	created, err := core.Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod: %v", err)
	}
	if !hasTokenVolume(created) {
		t.Fatalf("the API did not inject a kube-api-access volume: %+v", created.Spec.Volumes)
	}

	tokens := func() []string {
		out, _ := w.containerLog(ns, p.Name, "main")
		var toks []string
		for _, l := range strings.Split(out, "\n") {
			if tok, ok := strings.CutPrefix(l, "TOKEN "); ok && tok != "" {
				toks = append(toks, tok)
			}
		}
		return toks
	}
	var first string
	within(t, runBound, "the container read a token", func() (bool, string) {
		toks := tokens()
		if len(toks) == 0 {
			out, err := w.containerLog(ns, p.Name, "main")
			return false, out + errString(err)
		}
		first = toks[0]
		return true, ""
	})
	out, _ := w.containerLog(ns, p.Name, "main")
	if !strings.Contains(out, "NS "+ns+"\n") || !strings.Contains(out, "CA -----BEGIN CERTIFICATE-----") {
		t.Errorf("namespace or ca.crt missing from the volume; the container printed:\n%s", out)
	}

	review := func(tok string) *authnv1.TokenReviewStatus {
		t.Helper()
		r, err := w.kube.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: tok}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("token review: %v", err)
		}
		return &r.Status
	}
	st := review(first)
	if !st.Authenticated || st.User.Username != "system:serviceaccount:"+ns+":robot" {
		t.Fatalf("the pod's token: authenticated %v as %q (%s), want system:serviceaccount:%s:robot", st.Authenticated, st.User.Username, st.Error, ns)
	}
	if got := st.User.Extra["authentication.kubernetes.io/pod-name"]; len(got) != 1 || got[0] != p.Name {
		t.Errorf("token bound to pod %v, want %s", got, p.Name)
	}
	if got := st.User.Extra["authentication.kubernetes.io/pod-uid"]; len(got) != 1 || got[0] != string(created.UID) {
		t.Errorf("token bound to pod uid %v, want %s", got, created.UID)
	}

	// Renewed: the running container sees a new token, which works too.
	var renewed string
	within(t, runBound, "a renewed token in the running container", func() (bool, string) {
		toks := tokens()
		if len(toks) < 2 {
			return false, strings.Join(toks, "\n")
		}
		renewed = toks[len(toks)-1]
		return true, ""
	})
	if st := review(renewed); !st.Authenticated {
		t.Errorf("the renewed token is refused: %s", st.Error)
	}
	live := w.kube.CoreV1().Pods(ns)
	if got, err := live.Get(ctx, p.Name, metav1.GetOptions{}); err != nil || got.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("the container restarted to get its new token: %v", err)
	}

	// Deleted, the pod's token stops working (it is bound to the pod).
	if err := live.Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	w.waitPodGone(t, created)
	within(t, readyBound, "the deleted pod's token refused", func() (bool, string) {
		st := review(renewed)
		return !st.Authenticated, st.User.Username
	})
}

func hasTokenVolume(p *v1.Pod) bool {
	for _, v := range p.Spec.Volumes {
		if strings.HasPrefix(v.Name, "kube-api-access-") {
			return true
		}
	}
	return false
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
